"""Path-based language detection (extension / well-known file name).

Deliberately simple and content-free: a path maps to one language or to "" when unknown.
Ambiguous extensions are resolved to their most common meaning (``.h`` -> C, ``.m`` ->
Objective-C, ``.pl`` -> Perl, ``.ts`` -> TypeScript).
Results are cached per path with ``functools.lru_cache``.
"""

from __future__ import annotations

from functools import lru_cache

__all__ = ["language_for"]

# Exact (case-sensitive first, then lower-cased) file names.
_FILENAMES: dict[str, str] = {
    "Dockerfile": "Dockerfile",
    "Containerfile": "Dockerfile",
    "Makefile": "Makefile",
    "GNUmakefile": "Makefile",
    "makefile": "Makefile",
    "CMakeLists.txt": "CMake",
    "Rakefile": "Ruby",
    "Gemfile": "Ruby",
    "Vagrantfile": "Ruby",
    "Podfile": "Ruby",
    "Jenkinsfile": "Groovy",
    "BUILD": "Starlark",
    "BUILD.bazel": "Starlark",
    "WORKSPACE": "Starlark",
    "meson.build": "Meson",
    "go.mod": "Go Module",
    "go.sum": "Go Module",
    "Cargo.lock": "TOML",
    "Pipfile": "TOML",
    "requirements.txt": "Text",
    "LICENSE": "Text",
    "COPYING": "Text",
    "README": "Text",
    ".bashrc": "Shell",
    ".bash_profile": "Shell",
    ".zshrc": "Shell",
    ".profile": "Shell",
    ".gitignore": "Ignore List",
    ".dockerignore": "Ignore List",
    ".gitattributes": "Git Attributes",
    ".gitmodules": "Git Config",
    ".editorconfig": "EditorConfig",
}

_EXTENSIONS: dict[str, str] = {
    # Python
    ".py": "Python",
    ".pyi": "Python",
    ".pyw": "Python",
    ".pyx": "Cython",
    ".pxd": "Cython",
    ".ipynb": "Jupyter Notebook",
    # JavaScript / TypeScript / web
    ".js": "JavaScript",
    ".mjs": "JavaScript",
    ".cjs": "JavaScript",
    ".jsx": "JavaScript",
    ".ts": "TypeScript",
    ".mts": "TypeScript",
    ".cts": "TypeScript",
    ".tsx": "TypeScript",
    ".vue": "Vue",
    ".svelte": "Svelte",
    ".html": "HTML",
    ".htm": "HTML",
    ".xhtml": "HTML",
    ".css": "CSS",
    ".scss": "SCSS",
    ".sass": "Sass",
    ".less": "Less",
    # systems
    ".go": "Go",
    ".rs": "Rust",
    ".c": "C",
    ".h": "C",
    ".cc": "C++",
    ".cpp": "C++",
    ".cxx": "C++",
    ".c++": "C++",
    ".hh": "C++",
    ".hpp": "C++",
    ".hxx": "C++",
    ".h++": "C++",
    ".ipp": "C++",
    ".m": "Objective-C",
    ".mm": "Objective-C++",
    ".swift": "Swift",
    ".zig": "Zig",
    ".nim": "Nim",
    ".d": "D",
    ".asm": "Assembly",
    ".s": "Assembly",
    # JVM / .NET
    ".java": "Java",
    ".kt": "Kotlin",
    ".kts": "Kotlin",
    ".scala": "Scala",
    ".sc": "Scala",
    ".groovy": "Groovy",
    ".gradle": "Groovy",
    ".clj": "Clojure",
    ".cljs": "Clojure",
    ".cljc": "Clojure",
    ".edn": "Clojure",
    ".cs": "C#",
    ".fs": "F#",
    ".fsx": "F#",
    ".vb": "Visual Basic .NET",
    # scripting
    ".rb": "Ruby",
    ".erb": "HTML+ERB",
    ".php": "PHP",
    ".pl": "Perl",
    ".pm": "Perl",
    ".t": "Perl",
    ".lua": "Lua",
    ".r": "R",
    ".rmd": "RMarkdown",
    ".jl": "Julia",
    ".dart": "Dart",
    ".ex": "Elixir",
    ".exs": "Elixir",
    ".erl": "Erlang",
    ".hrl": "Erlang",
    ".hs": "Haskell",
    ".lhs": "Haskell",
    ".ml": "OCaml",
    ".mli": "OCaml",
    ".elm": "Elm",
    ".tcl": "Tcl",
    ".vim": "Vim Script",
    ".el": "Emacs Lisp",
    ".lisp": "Common Lisp",
    ".scm": "Scheme",
    ".rkt": "Racket",
    ".sh": "Shell",
    ".bash": "Shell",
    ".zsh": "Shell",
    ".ksh": "Shell",
    ".fish": "fish",
    ".ps1": "PowerShell",
    ".psm1": "PowerShell",
    ".bat": "Batchfile",
    ".cmd": "Batchfile",
    ".awk": "Awk",
    # data / config / docs
    ".md": "Markdown",
    ".markdown": "Markdown",
    ".mdx": "MDX",
    ".rst": "reStructuredText",
    ".adoc": "AsciiDoc",
    ".tex": "TeX",
    ".txt": "Text",
    ".json": "JSON",
    ".jsonc": "JSON",
    ".json5": "JSON5",
    ".yaml": "YAML",
    ".yml": "YAML",
    ".toml": "TOML",
    ".ini": "INI",
    ".cfg": "INI",
    ".xml": "XML",
    ".xsd": "XML",
    ".xsl": "XSLT",
    ".svg": "SVG",
    ".csv": "CSV",
    ".tsv": "TSV",
    ".sql": "SQL",
    ".graphql": "GraphQL",
    ".gql": "GraphQL",
    ".proto": "Protocol Buffer",
    ".tf": "HCL",
    ".hcl": "HCL",
    ".nix": "Nix",
    ".cmake": "CMake",
    ".mk": "Makefile",
    ".mak": "Makefile",
    ".dockerfile": "Dockerfile",
    ".j2": "Jinja",
    ".jinja": "Jinja",
    ".jinja2": "Jinja",
    ".mustache": "Mustache",
    ".hbs": "Handlebars",
    ".cu": "CUDA",
    ".sol": "Solidity",
    ".wat": "WebAssembly",
    ".bzl": "Starlark",
}


@lru_cache(maxsize=65536)
def language_for(path: str) -> str:
    """Return the language of ``path`` (a repository-relative path), or "" if unknown."""
    name = path.rsplit("/", 1)[-1]
    if not name:
        return ""
    lang = _FILENAMES.get(name)
    if lang is not None:
        return lang
    lower = name.lower()
    lang = _FILENAMES.get(lower)
    if lang is not None:
        return lang
    if lower.startswith("dockerfile."):  # Dockerfile.dev, Dockerfile.prod, ...
        return "Dockerfile"
    dot = lower.rfind(".")
    if dot <= 0:  # no extension, or a dotfile like ".env" that is not a known name
        return ""
    return _EXTENSIONS.get(lower[dot:], "")
