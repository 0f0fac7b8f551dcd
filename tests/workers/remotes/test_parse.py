"""Tests for workers.remotes.parse: rows G1-G13 of the attack catalog (docs/security.md)
and lists of hostile inputs.  No Django, no network: DNS is a fake table."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from workers.remotes.branches import normalise_branch
from workers.remotes.hosts import check_address
from workers.remotes.parse import ALLOWED_SCHEMES, Remote, parse_remote
from workers.remotes.policy import InvalidRemote, RemotePolicy
from workers.remotes.redaction import redact

# --------------------------------------------------------------------------- fixtures

PUBLIC_V4 = "140.82.112.3"
PUBLIC_V6 = "2606:4700:90:0:f22e:fbec:5bed:a9b9"

DNS: dict[str, list[str]] = {
    "github.com": [PUBLIC_V4],
    "gitlab.com": ["172.65.251.78", PUBLIC_V6],
    "example.com": ["93.184.216.34"],
    "one.example.com": ["93.184.216.34"],
    "xn--mnchen-3ya.de": ["93.184.216.35"],
    "loopback.evil.example.com": ["127.0.0.1"],
    "private.evil.example.com": ["10.0.0.1"],
    "metadata.evil.example.com": ["169.254.169.254"],
    "mixed.evil.example.com": ["93.184.216.34", "127.0.0.1"],
    "mapped.evil.example.com": ["::ffff:127.0.0.1"],
    "ula.evil.example.com": ["fd00:ec2::254"],
    "cgnat.evil.example.com": ["100.64.0.1"],
    "garbage.evil.example.com": ["not-an-ip"],
    "corp-git.example.com": ["10.1.2.3"],
}


class FakeResolver:
    """The outside network is the one thing we fake: a DNS table plus a call log."""

    def __init__(self, table: dict[str, list[str]] | None = None) -> None:
        self.table = DNS if table is None else table
        self.calls: list[tuple[str, int | None]] = []

    def __call__(self, host: str, port: int | None) -> list[str]:
        self.calls.append((host, port))
        if host not in self.table:
            raise OSError(f"fake NXDOMAIN {host}")
        return list(self.table[host])


@pytest.fixture
def resolver() -> FakeResolver:
    return FakeResolver()


@pytest.fixture
def policy(resolver: FakeResolver) -> RemotePolicy:
    return RemotePolicy(resolve=resolver)


def refused(raw: str, policy: RemotePolicy) -> str:
    with pytest.raises(InvalidRemote) as info:
        parse_remote(raw, policy)
    message = str(info.value)
    assert message, "refusal must explain itself"
    assert "\n" not in message and "\r" not in message, "message must be one line"
    assert "TOKEN" not in message and "SECRET" not in message
    return message


# --------------------------------------------------------------------------- accepted


@pytest.mark.parametrize(
    ("raw", "url", "git_url"),
    [
        (
            "https://github.com/pallets/flask.git",
            "https://github.com/pallets/flask",
            "https://github.com/pallets/flask.git",
        ),
        (
            "https://github.com/pallets/flask",
            "https://github.com/pallets/flask",
            "https://github.com/pallets/flask",
        ),
        (
            "https://GitHub.com/pallets/flask",
            "https://github.com/pallets/flask",
            "https://github.com/pallets/flask",
        ),
        (
            "HTTPS://github.com:443/pallets/flask/",
            "https://github.com/pallets/flask",
            "https://github.com/pallets/flask",
        ),
        (
            "  https://github.com/pallets/flask.git/  ",
            "https://github.com/pallets/flask",
            "https://github.com/pallets/flask.git",
        ),
        (
            "https://github.com./pallets/Flask",
            "https://github.com/pallets/Flask",
            "https://github.com/pallets/Flask",
        ),
        ("http://example.com:80/r", "http://example.com/r", "http://example.com/r"),
        (
            "http://example.com:8080/r.git",
            "http://example.com:8080/r",
            "http://example.com:8080/r.git",
        ),
        ("git://gitlab.com/a/b.git", "git://gitlab.com/a/b", "git://gitlab.com/a/b.git"),
        ("git://gitlab.com:9418/a/b", "git://gitlab.com/a/b", "git://gitlab.com/a/b"),
        (
            "git@github.com:pallets/flask.git",
            "ssh://git@github.com/pallets/flask",
            "git@github.com:pallets/flask.git",
        ),
        (
            "ssh://git@github.com:22/pallets/flask.git",
            "ssh://git@github.com/pallets/flask",
            "ssh://git@github.com/pallets/flask.git",
        ),
        (
            "ssh://github.com:2222/srv/r.git",
            "ssh://github.com:2222/srv/r",
            "ssh://github.com:2222/srv/r.git",
        ),
        (
            "https://example.com/a/%7euser/r%2Dx",
            "https://example.com/a/~user/r-x",
            "https://example.com/a/~user/r-x",
        ),
        (
            "https://example.com/a/b%20c",
            "https://example.com/a/b%20c",
            "https://example.com/a/b%20c",
        ),
        ("https://140.82.112.3/o/r", "https://140.82.112.3/o/r", "https://140.82.112.3/o/r"),
        ("https://0x8c.82.112.3/o/r", "https://140.82.112.3/o/r", "https://140.82.112.3/o/r"),
        ("https://2354212867/o/r", "https://140.82.112.3/o/r", "https://140.82.112.3/o/r"),
        (
            "https://[2606:4700:90::f22e:fbec:5bed:a9b9]/o/r",
            "https://[2606:4700:90:0:f22e:fbec:5bed:a9b9]/o/r",
            "https://[2606:4700:90:0:f22e:fbec:5bed:a9b9]/o/r",
        ),
        (
            "https://xn--mnchen-3ya.de/r",
            "https://xn--mnchen-3ya.de/r",
            "https://xn--mnchen-3ya.de/r",
        ),
        ("https://github.com/o/.git", "https://github.com/o/.git", "https://github.com/o/.git"),
    ],
)
def test_accepted_remote_is_normalised(
    raw: str, url: str, git_url: str, policy: RemotePolicy
) -> None:
    remote = parse_remote(raw, policy)
    assert remote.url == url
    assert remote.git_url() == git_url
    assert remote.scheme in ALLOWED_SCHEMES
    assert remote.pinned_addresses
    # Canonical form is a fixed point: dedup keys are stable.
    assert parse_remote(remote.url, policy).url == url


@pytest.mark.parametrize(
    "variants",
    [
        [
            "https://github.com/pallets/flask.git",
            "https://GitHub.com/pallets/flask",
            "https://github.com:443/pallets/flask/",
            "https://GITHUB.COM/pallets/flask.git/",
            "https://github.com./pallets/flask",
        ],
        [
            "git@github.com:pallets/flask.git",
            "ssh://git@github.com/pallets/flask",
            "ssh://git@GitHub.com:22/pallets/flask.git/",
        ],
        ["https://example.com/a/%7Euser/r", "https://example.com/a/~user/r.git"],
    ],
)
def test_dedup_variants_map_to_one_url(variants: list[str], policy: RemotePolicy) -> None:
    assert len({parse_remote(v, policy).url for v in variants}) == 1


def test_dedup_remote_equality_ignores_dot_git(policy: RemotePolicy) -> None:
    a = parse_remote("https://github.com/pallets/flask.git", policy)
    b = parse_remote("https://github.com/pallets/flask", policy)
    assert a == b and hash(a) == hash(b)
    assert a.git_url() != b.git_url()


def test_path_case_is_kept(policy: RemotePolicy) -> None:
    assert parse_remote("https://github.com/Pallets/Flask", policy).url.endswith("/Pallets/Flask")


def test_remote_fields(policy: RemotePolicy) -> None:
    r = parse_remote("https://GitLab.com:8443/a/b.git", policy)
    assert (r.scheme, r.host, r.port) == ("https", "gitlab.com", 8443)
    assert r.pinned_addresses == ("172.65.251.78", PUBLIC_V6)
    v6 = parse_remote("https://[2606:4700:90::f22e:fbec:5bed:a9b9]/o/r", policy)
    assert v6.host == PUBLIC_V6 and v6.pinned_addresses == (PUBLIC_V6,)


def test_resolver_receives_effective_port(resolver: FakeResolver, policy: RemotePolicy) -> None:
    parse_remote("https://github.com/o/r", policy)
    parse_remote("git@github.com:o/r", policy)
    parse_remote("http://github.com:8080/o/r", policy)
    assert resolver.calls == [("github.com", 443), ("github.com", 22), ("github.com", 8080)]


def test_resolve_hosts_false_skips_dns(resolver: FakeResolver) -> None:
    pol = RemotePolicy(resolve=resolver, resolve_hosts=False)
    r = parse_remote("https://not-in-table.example.org/o/r", pol)
    assert r.pinned_addresses == () and resolver.calls == []
    # Literal addresses are still checked without DNS.
    refused("https://127.0.0.1/o/r", pol)


# --------------------------------------------------------------------------- G1 transports


@pytest.mark.parametrize(
    "raw",
    [
        "ext::sh -c touch% /tmp/pwn",
        "ext::sh",
        "fd::17/foo",
        "foo::bar",
        "https::example.com/foo.git",
        "http:::example.com/foo.git",
        "https://github.com/a::b",
    ],
)
def test_g1_transport_helper_syntax_refused(
    raw: str, policy: RemotePolicy, resolver: FakeResolver
) -> None:
    message = refused(raw, policy)
    assert "transport" in message or "whitespace" in message
    assert resolver.calls == []


@pytest.mark.parametrize(
    "raw",
    [
        "ftp://example.com/r.git",
        "javascript://host/t.git%0aalert(1)",
        "javascript:alert(1)",
        "data:text/plain,x",
        "git+ssh://github.com/o/r",
        "rsync://example.com/r",
        "gopher://example.com/r",
    ],
)
def test_g1_other_schemes_refused(raw: str, policy: RemotePolicy) -> None:
    message = refused(raw, policy)
    assert "not accepted" in message or "unrecognised" in message


# --------------------------------------------------------------------------- G2 options


@pytest.mark.parametrize(
    "raw",
    [
        "--upload-pack=touch /tmp/pwn",
        "--upload-pack=touch",
        "-u touch /tmp/pwn",
        "--upl=touch",
        "-utouch${IFS}/tmp/pwn",
        "-futouch",
        "-c protocol.ext.allow=always",
        "-cprotocol.ext.allow=always",
        "--config=core.sshCommand=touch",
        "--template=/tmp/t",
        "--bundle-uri=file:///tmp/x",
        "--separate-git-dir=/tmp/g",
        "--single-branch --config protocol.ext.allow=always",
        "-oProxyCommand=x:repo",
    ],
)
def test_g2_option_looking_values_refused(raw: str, policy: RemotePolicy) -> None:
    message = refused(raw, policy)
    assert "option" in message or "whitespace" in message


@pytest.mark.parametrize(
    "raw",
    [
        "https://github.com/-u/r",
        "https://github.com/o/--upload-pack=x",
        "git@github.com:-o/r",
        "git@github.com:o/-r",
        "ssh://git@github.com/-oProxyCommand=x",
    ],
)
def test_g2_path_segment_starting_with_dash_refused(raw: str, policy: RemotePolicy) -> None:
    assert "'-'" in refused(raw, policy)


# --------------------------------------------------------------------------- G3 branches


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, ""),
        ("", ""),
        ("   ", ""),
        ("main", "main"),
        ("feature/x-1", "feature/x-1"),
        ("release/2.0", "release/2.0"),
        ("refs/heads/dev", "dev"),
        ("v1.2.3", "v1.2.3"),
        ("a@b", "a@b"),
    ],
)
def test_g3_branch_accepted(raw: str | None, expected: str) -> None:
    assert normalise_branch(raw) == expected


@pytest.mark.parametrize(
    "raw",
    [
        "--output=/tmp/pwn",
        "-o/tmp/pwn",
        "--exec=touch /tmp/pwn",
        "--no-index",
        "--orderfile=/etc/shadow",
        "--pathspec-from-file=/etc/passwd",
        "../../../../etc/passwd",
        "refs/heads/../../x",
        "HEAD@{-1}",
        "a..b..c",
        "a\x00b",
        "a\nb",
        "a b",
        "a\tb",
        "a\u202eb",
        "x~1",
        "x^",
        "a:b",
        "a?",
        "a*",
        "a[b",
        "a\\b",
        "@",
        "HEAD",
        "x.lock",
        "a/b.lock/c",
        "x/",
        "/x",
        "a//b",
        "x.",
        ".hidden",
        "a/.b",
        "a/-b",
        "refs/heads/",
        "a" * 256,
    ],
)
def test_g3_branch_refused(raw: str) -> None:
    with pytest.raises(InvalidRemote) as info:
        normalise_branch(raw)
    assert "\n" not in str(info.value) and str(info.value)


def test_g3_branch_length_limit_is_255() -> None:
    assert normalise_branch("a" * 255) == "a" * 255


# --------------------------------------------------------------------------- G4 local paths


@pytest.mark.parametrize(
    "raw",
    [
        "/etc",
        "/srv/app/repos/other-user",
        "file:///etc/passwd",
        "file:///var/lib/app",
        "file:///var/lib/app/repos/other",
        "./",
        "../x",
        "~/x",
        "C:\\x",
        "\\\\host\\share",
        "relative/path",
        "x",
        ".",
    ],
)
def test_g4_local_sources_refused_without_roots(raw: str, policy: RemotePolicy) -> None:
    refused(raw, policy)


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "repos"
    outside = tmp_path / "secret"
    (root / "alice" / "proj").mkdir(parents=True)
    (root / "alice" / "file.txt").write_text("x")
    outside.mkdir()
    (root / "escape").symlink_to(outside)
    (root / "inner-link").symlink_to(root / "alice" / "proj")
    return root, outside


@pytest.fixture
def local_policy(roots: tuple[Path, Path], resolver: FakeResolver) -> RemotePolicy:
    return RemotePolicy(local_roots=(roots[0],), resolve=resolver)


def test_g4_local_path_under_root_accepted(
    roots: tuple[Path, Path], local_policy: RemotePolicy
) -> None:
    root = roots[0]
    real = os.path.realpath(root / "alice" / "proj")
    for raw in (
        str(root / "alice" / "proj"),
        str(root / "alice" / "proj") + "/",
        str(root / "alice" / "x" / ".." / "proj"),
        f"file://{root}/alice/proj",
        str(root / "inner-link"),
    ):
        remote = parse_remote(raw, local_policy)
        assert remote == Remote(url=real, scheme="file", host=None, port=None)
        assert remote.git_url() == real
        assert remote.pinned_addresses == ()


@pytest.mark.parametrize(
    "relative",
    [
        "escape",  # symlink inside the root pointing outside it
        "escape/sub",
        "../secret",  # '..' escape
        "alice/../../secret",
        "alice/../..",
        "../repos-sibling",
    ],
)
def test_g4_local_escape_refused(
    relative: str, roots: tuple[Path, Path], local_policy: RemotePolicy
) -> None:
    message = refused(f"{roots[0]}/{relative}", local_policy)
    assert "not under an allowed repository root" in message
    refused(f"file://{roots[0]}/{relative}", local_policy)


def test_g4_local_missing_or_file_refused(
    roots: tuple[Path, Path], local_policy: RemotePolicy
) -> None:
    assert "not an existing directory" in refused(f"{roots[0]}/nope", local_policy)
    assert "not an existing directory" in refused(f"{roots[0]}/alice/file.txt", local_policy)
    # Outside the root the answer does not reveal existence.
    assert refused("/nonexistent-xyz", local_policy) == refused("/etc", local_policy)


@pytest.mark.parametrize(
    "suffix",
    ["/-x", "/%0a", "%00", "?q=1", "#frag"],
)
def test_g4_local_bad_shapes_refused(
    suffix: str, roots: tuple[Path, Path], local_policy: RemotePolicy
) -> None:
    refused(f"file://{roots[0]}/alice{suffix}", local_policy)


def test_g4_file_url_with_host_refused(local_policy: RemotePolicy) -> None:
    assert "file:///" in refused("file://host/share/repo", local_policy)


# --------------------------------------------------------------------------- G5 literal IPs

APPENDIX_A_INTERNAL = [
    "http://127.0.0.1/x.git",
    "https://127.1/x",
    "https://0177.1/x",
    "https://017700000001/x",
    "https://0x7f.1/x",
    "https://0x7f.0.0.1/x",
    "https://0x7f000001/x",
    "https://2130706433/x",
    "https://127.000.000.001/x",
    "https://127.0.1/x",
    "https://0177.0.0.1/x",
    "https://127.0.0.1./x",
    "https://[::1]/x",
    "https://[::]/x",
    "https://0.0.0.0/x",
    "https://0/x",
    "https://[0:0:0:0:0:ffff:127.0.0.1]/x",
    "https://[::ffff:127.0.0.1]/x",
    "https://[::ffff:7f00:1]/x",
    "http://169.254.169.254/latest/meta-data/",
    "http://[::ffff:169.254.169.254]/",
    "http://[::ffff:a9fe:a9fe]/",
    "http://[fd00:ec2::254]/",
    "http://168.63.129.16/",
    "http://100.100.100.200/x",
    "http://100.64.0.1/",
    "http://10.0.0.2/",
    "http://172.16.0.2/",
    "http://192.168.1.2/",
    "http://[fc00:bf8b:e62c:abcd:abcd:aaaa:aaaa:aaaa]/",
    "http://[fc00::1]/",
    "http://[fe80::c800:eff:fe74:8]/",
    "http://[fe80::1]/",
    "http://255.255.255.255/",
    "http://0xffffffff/",
    "http://4294967295/",
    "http://[64:ff9b::a9fe:a9fe]/",
    "http://[64:ff9b::7f00:1]/x",
    "http://[2002:a9fe:a9fe::]/",
    "http://[2002:7f00:1::]/x",
    "http://[::127.0.0.1]/x",
    "http://[2001::1]/x",
    "http://224.0.0.1/x",
    "http://[ff02::1]/x",
    "http://240.0.0.1/x",
    "http://198.18.0.1/x",
    "http://192.0.2.1/x",
    "http://[fec0::1]/x",
    "ssh://git@127.0.0.1/x",
    "git@[::1]:x",
    "git@10.0.0.1:o/r",
    "git://192.168.0.1/x",
]


@pytest.mark.parametrize("raw", APPENDIX_A_INTERNAL)
def test_g5_internal_literal_addresses_refused_in_every_encoding(
    raw: str, policy: RemotePolicy, resolver: FakeResolver
) -> None:
    message = refused(raw, policy)
    assert "internal addresses are not accepted" in message
    assert resolver.calls == [], "refused before any socket/DNS"


@pytest.mark.parametrize(
    "raw",
    [
        "http://1.1.1.1.1/x",
        "http://256.1.1.1/x",
        "http://1.2.3.0x100/x",
        "http://08.1.1.1/x",
        "http://1.2.3.4294967296/x",
        "http://0xg.1/x",
        "http://[127.0.0.1]/x",
        "http://[fe80::1%25eth0]/x",
        "http://[v1.x]/x",
        "http://[::1/x",
    ],
)
def test_g5_malformed_numeric_hosts_refused(raw: str, policy: RemotePolicy) -> None:
    message = refused(raw, policy)
    assert "not a valid" in message or "unterminated" in message or "transport" in message


@pytest.mark.parametrize(
    ("ip", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("10.0.0.1", "private"),
        ("169.254.169.254", "metadata"),
        ("fd00:ec2::254", "metadata"),
        ("100.100.100.200", "metadata"),
        ("169.254.1.1", "link-local"),
        ("100.64.0.1", "carrier-grade"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("240.0.0.1", "reserved"),
        ("::ffff:10.0.0.1", "private"),
        ("::ffff:7f00:1", "loopback"),
        ("64:ff9b::a9fe:a9fe", "metadata"),
        ("2002:a00:1::", "private"),
        ("::a00:1", "IPv4-compatible"),
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"),
        ("fe80::1%eth0", "zone"),
        ("192.0.2.1", "private"),  # TEST-NET-1
    ],
)
def test_check_address_reasons(ip: str, reason: str) -> None:
    with pytest.raises(InvalidRemote, match=reason):
        check_address(ip, RemotePolicy())


@pytest.mark.parametrize(
    "ip", [PUBLIC_V4, PUBLIC_V6, "8.8.8.8", "::ffff:8.8.8.8", "64:ff9b::808:808", "2002:808:808::"]
)
def test_check_address_public_accepted(ip: str) -> None:
    check_address(ip, RemotePolicy())


def test_check_address_invalid_string_refused() -> None:
    with pytest.raises(InvalidRemote):
        check_address("999.1.1.1", RemotePolicy())


def test_allowed_nets_permit_internal_but_never_metadata() -> None:
    pol = RemotePolicy(
        allowed_nets=(
            ipaddress.ip_network("10.0.0.0/8"),
            ipaddress.ip_network("169.254.0.0/16"),
            ipaddress.ip_network("127.0.0.0/8"),
        )
    )
    check_address("10.1.2.3", pol)
    check_address("::ffff:10.1.2.3", pol)
    check_address("127.0.0.1", pol)
    check_address("169.254.1.1", pol)
    with pytest.raises(InvalidRemote, match="metadata"):
        check_address("169.254.169.254", pol)
    with pytest.raises(InvalidRemote, match="private"):
        check_address("192.168.1.1", pol)


# --------------------------------------------------------------------------- G6 DNS


@pytest.mark.parametrize(
    ("host", "reason"),
    [
        ("loopback.evil.example.com", "loopback"),
        ("private.evil.example.com", "private"),
        ("metadata.evil.example.com", "metadata"),
        ("mixed.evil.example.com", "loopback"),
        ("mapped.evil.example.com", "loopback"),
        ("ula.evil.example.com", "metadata"),
        ("cgnat.evil.example.com", "carrier-grade"),
        ("garbage.evil.example.com", "invalid address"),
        ("unknown.example.org", "could not be resolved"),
        ("foobar.x", "could not be resolved"),
    ],
)
def test_g6_hostname_resolving_to_refused_address_refused(
    host: str, reason: str, policy: RemotePolicy
) -> None:
    assert reason in refused(f"https://{host}/o/r.git", policy)
    assert reason in refused(f"git@{host}:o/r.git", policy)


def test_g6_empty_answer_is_unresolvable() -> None:
    pol = RemotePolicy(resolve=FakeResolver({"empty.example.com": []}))
    assert "could not be resolved" in refused("https://empty.example.com/r", pol)


def test_g6_allowed_nets_make_private_host_accepted(resolver: FakeResolver) -> None:
    pol = RemotePolicy(resolve=resolver, allowed_nets=(ipaddress.ip_network("10.0.0.0/8"),))
    remote = parse_remote("https://corp-git.example.com/team/r.git", pol)
    assert remote.pinned_addresses == ("10.1.2.3",)
    assert parse_remote("https://10.0.0.2/x", pol).pinned_addresses == ("10.0.0.2",)
    assert parse_remote("git@10.0.0.1:o/r", pol).url == "ssh://git@10.0.0.1/o/r"
    # Other ranges stay refused.
    refused("https://loopback.evil.example.com/r", pol)
    refused("https://metadata.evil.example.com/r", pol)


@pytest.mark.parametrize(
    "raw",
    [
        "https://localhost/x",
        "https://LOCALHOST./x",
        "https://foo.localhost/x",
        "http://metadata.google.internal/",
        "https://git.corp/x",
        "https://nas.local/x",
        "https://1.0.0.127.in-addr.arpa/x",
        "https://router.home.arpa/x",
    ],
)
def test_g6_internal_names_refused_without_dns(
    raw: str, policy: RemotePolicy, resolver: FakeResolver
) -> None:
    assert "internal name" in refused(raw, policy)
    assert resolver.calls == []


@pytest.mark.parametrize("raw", ["https://host/x", "git@host:repo", "http://redis:6379/x"])
def test_g6_single_label_hosts_refused(raw: str, policy: RemotePolicy) -> None:
    assert "fully qualified" in refused(raw, policy)


# --------------------------------------------------------------------------- G7 pinning


def test_g7_pinned_addresses_are_the_validated_ones() -> None:
    answers = iter([["93.184.216.34"], ["127.0.0.1"]])

    def rebinding(host: str, port: int | None) -> list[str]:
        return next(answers)

    pol = RemotePolicy(resolve=rebinding)
    remote = parse_remote("https://rebind.example.com/r.git", pol)
    # The worker pins this with http.curloptResolve; the second (rebound)
    # answer is never consulted by the validator.
    assert remote.pinned_addresses == ("93.184.216.34",)
    # A fresh validation sees the rebound answer and refuses.
    refused("https://rebind.example.com/r.git", pol)


# --------------------------------------------------------------------------- G9 credentials


@pytest.mark.parametrize(
    "raw",
    [
        "https://alice:TOKEN@github.com/o/r.git",
        "https://TOKEN@github.com/o/r.git",
        "http://TOKEN:x-oauth-basic@github.com/o/r",
        "https://user@github.com/o/r",
        "https://a@TOKEN@github.com/o/r",
        "git://TOKEN@github.com/o/r",
        "ssh://git:TOKEN@github.com/o/r",
        "git:TOKEN@github.com:o/r",
    ],
)
def test_g9_credentials_in_url_refused(raw: str, policy: RemotePolicy) -> None:
    message = refused(raw, policy)
    assert "credentials in URLs are not accepted" in message or "unrecognised" in message
    assert "TOKEN" not in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "fatal: could not read https://alice:TOKEN@github.com/o/r.git",
            "fatal: could not read https://<redacted>@github.com/o/r.git",
        ),
        ("clone http://TOKEN@h.example/r failed", "clone http://<redacted>@h.example/r failed"),
        ("https://a@b:TOKEN@h.example/r", "https://<redacted>@h.example/r"),
        ("ssh://git@github.com/o/r", "ssh://git@github.com/o/r"),
        ("ssh://git:TOKEN@github.com/o/r", "ssh://git:<redacted>@github.com/o/r"),
        (
            "http.extraHeader=Authorization: Bearer TOKEN",
            "http.extraHeader=Authorization: <redacted>",
        ),
        ("authorization=basic TOKEN rest", "authorization=<redacted> rest"),
        ("nothing to see https://github.com/o/r", "nothing to see https://github.com/o/r"),
        (
            "two: https://u:TOKEN@a.example/x and ftp://TOKEN@b.example/",
            "two: https://<redacted>@a.example/x and ftp://<redacted>@b.example/",
        ),
    ],
)
def test_g9_redact_removes_userinfo(text: str, expected: str) -> None:
    assert redact(text) == expected
    assert "TOKEN" not in redact(text)


# --------------------------------------------------------------------------- G10 env vars


@pytest.mark.parametrize(
    "raw",
    [
        "https://example.com/$DJANGO_SECRET_KEY/r.git",
        "https://example.com/${SECRET}/r.git",
        "https://example.com/%SECRET%/r.git",
        "https://example.com/`id`/r.git",
        "git@example.com:$HOME/r.git",
    ],
)
def test_g10_env_var_syntax_refused_not_expanded(raw: str, policy: RemotePolicy) -> None:
    refused(raw, policy)


# --------------------------------------------------------------------------- G11 control chars


@pytest.mark.parametrize(
    "raw",
    [
        "https://github.com/o/r.git%0a[core]%0asshCommand=touch%20/tmp/pwn",
        "https://github.com/o/r.git%0asshCommand=touch",
        "https://github.com/o/r.git%0D%0A",
        "https://github.com/o/r%00",
        "https://github.com/o/r.git\r\n",
        "https://gi\nthub.com/o/r",
        "https://github.com/o/r\x00",
        "https://github.com/o/\tr",
        "https://github.com/o/r x",
        "https://github.com/o/r\u2028",
        "https://github.com/o/r\u00a0",
        "./%0ahost=example.com/foo.git",
        "https://one.example.com/evil?%0ahost=two.example.com",
        "https://one.example.com/evil?x=1",
        "https://one.example.com/evil#frag",
        "https:///example.com/foo.git",
        "http://example.com:test/foo.git",
        "http://example.com:/foo.git",
        "http://:8080",
        "http://:8080/x",
        "https://github.com",
        "https://github.com/",
        "https://github.com//o/r",
        "https://github.com/o/../r",
        "https://github.com/o/./r",
        "https://github.com/o/%2e%2e/r",
        "https://github.com/o%2fr",
        "https://github.com/o/r%5c",
        'https://github.com/o/r"',
        "https://github.com/o/<r>",
        "https://github.com/ö/r",
        "https://example.com\\@evil.example.com/r",
    ],
)
def test_g11_control_chars_and_malformed_urls_refused(raw: str, policy: RemotePolicy) -> None:
    refused(raw, policy)


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ("", "enter a repository URL"),
        ("   ", "enter a repository URL"),
        ("\t\n", "enter a repository URL"),
        ("https://github.com/" + "a" * 2048, "longer than 2048"),
    ],
)
def test_empty_and_oversized_refused(raw: str, fragment: str, policy: RemotePolicy) -> None:
    assert fragment in refused(raw, policy)


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ("https://github.com:0/o/r", "out of range"),
        ("https://github.com:65536/o/r", "out of range"),
        ("https://github.com:99999/o/r", "out of range"),
        ("https://github.com:123456/o/r", "between 1 and 65535"),
        ("https://github.com:-1/o/r", "between 1 and 65535"),
        ("https://github.com:25/o/r.git", "port 25 is not allowed"),
        ("ssh://git@github.com:443/o/r", "port 443 is not allowed"),
    ],
)
def test_bad_ports_refused(raw: str, fragment: str, policy: RemotePolicy) -> None:
    assert fragment in refused(raw, policy)


def test_port_bounds_accepted(policy: RemotePolicy) -> None:
    assert parse_remote("https://github.com:65535/o/r", policy).port == 65535
    assert parse_remote("https://github.com:1024/o/r", policy).port == 1024


# --------------------------------------------------------------------------- G12 ssh


@pytest.mark.parametrize(
    "raw",
    [
        "ssh://-oProxyCommand=touch%20/tmp/pwn/x",
        "ssh://-oProxyCommand=x/r",
        "-oProxyCommand=x:repo",
        "ssh://-x@github.com/r",
        "-x@github.com:r",
        "ssh://@github.com/r",
        "ssh://git@-github.com/r",
        "git@-oProxyCommand=x:r",
        "ssh://git@github.com",
        "git@github.com:",
        "git@host:repo",
        "ssh://a b@github.com/r",
        "ssh://git@@github.com/r",
    ],
)
def test_g12_ssh_tricks_refused(raw: str, policy: RemotePolicy) -> None:
    refused(raw, policy)


def test_g12_scp_style_with_fqdn_accepted(policy: RemotePolicy) -> None:
    r = parse_remote("deploy_user.1@github.com:~/o/r.git", policy)
    assert r.scheme == "ssh" and r.url == "ssh://deploy_user.1@github.com/~/o/r"
    assert r.git_url() == "deploy_user.1@github.com:~/o/r.git"


# --------------------------------------------------------------------------- G13 IDN


@pytest.mark.parametrize(
    "raw",
    [
        "https://gitⅼαƄ.com/foo",
        "https://gitlab.ᴄοｍ/foo",
        "https://mißile.com/foo",
        "https://git\u00adhub.com/o/r",  # soft hyphen
        "https://github\u3002com/o/r",  # ideographic full stop
        "https://xn--zz.com/o/r",  # invalid punycode
        "https://gith_ub.com/o/r",
        "https://-github.com/o/r",
        "https://github-.com/o/r",
        "https://example" + "a" * 1024 + ".com/x",
        "https://" + "a" * 64 + ".com/x",
        "https://" + ".".join(["a" * 60] * 5) + "/x",
        "git@gitⅼαƄ.com:o/r",
    ],
)
def test_g13_idn_and_invalid_hostnames_refused(
    raw: str, policy: RemotePolicy, resolver: FakeResolver
) -> None:
    refused(raw, policy)
    assert resolver.calls == []


# --------------------------------------------------------------------------- messages


def test_invalid_remote_message_is_one_redacted_line() -> None:
    exc = InvalidRemote("bad https://alice:TOKEN@github.com/x\nsecond line")
    assert str(exc) == "bad https://<redacted>@github.com/x second line"
    assert isinstance(exc, ValueError)


def test_non_string_refused(policy: RemotePolicy) -> None:
    with pytest.raises(InvalidRemote):
        parse_remote(None, policy)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- fuzz

_FUZZ_DNS = {
    "github.com": [PUBLIC_V4],
    "a.example.com": ["127.0.0.1"],
    "b.example.com": ["93.184.216.34", "10.0.0.1"],
    "c.example.com": ["::ffff:169.254.169.254"],
    "d.example.com": [PUBLIC_V6],
}

_fragments = st.sampled_from(
    [
        "https://",
        "http://",
        "ssh://",
        "git://",
        "file://",
        "ext::",
        "git@",
        "@",
        ":",
        "::",
        "/",
        "//",
        "..",
        ".",
        "-",
        "--upload-pack=",
        "%0a",
        "%00",
        "%2f",
        "%",
        "?",
        "#",
        "[",
        "]",
        "[::1]",
        "[::ffff:127.0.0.1]",
        "127.1",
        "0x7f000001",
        "2130706433",
        "0177.1",
        "github.com",
        "GitHub.com",
        "a.example.com",
        "b.example.com",
        "c.example.com",
        "d.example.com",
        "localhost",
        ":22",
        ":443",
        ":0",
        ":99999",
        "o/r.git",
        ".git",
        "\n",
        "\x00",
        " ",
        "\\",
        "$HOME",
        "ß",
        "ⅼ",
        "\u202e",
        "user:pass@",
        "TOKEN@",
        "~",
        "/tmp",
    ]
)
_segment = st.lists(
    st.sampled_from([*"abcXYZ019-._~%2e0aF$:@!+ ß", "..", ".git", "-x"]),
    max_size=6,
).map("".join)
_host = st.one_of(
    st.sampled_from(
        [
            "github.com",
            "GitHub.com.",
            "a.example.com",
            "b.example.com",
            "c.example.com",
            "d.example.com",
            "unknown.example.org",
            "localhost",
            "[::1]",
            "[::ffff:7f00:1]",
            "[2606:4700:90::f22e:fbec:5bed:a9b9]",
            "127.1",
            "0x7f.1",
            "140.82.112.3",
            "2354212867",
            "0x8c.0x52.0x70.3",
            "10.0.0.1",
            "[fd00:ec2::254]",
            "-oX",
            "",
        ]
    ),
    st.from_regex(r"\A[0-9a-fx.]{1,20}\Z"),
)
_structured = st.builds(
    lambda scheme, user, host, port, segs: (
        f"{scheme}{user}{host}{port}/" + "/".join(segs)
        if scheme
        else f"{user or 'git@'}{host}:" + "/".join(segs)
    ),
    st.sampled_from(["https://", "HTTP://", "ssh://", "git://", ""]),
    st.sampled_from(["", "", "git@", "TOKEN@", "u:pass@", "-x@"]),
    _host,
    st.sampled_from(["", "", ":443", ":22", ":8080", ":0", ":25", ":x"]),
    st.lists(_segment, min_size=0, max_size=4),
)
_remote_like = st.one_of(
    st.text(max_size=80), st.lists(_fragments, max_size=10).map("".join), _structured
)


@settings(
    max_examples=600,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(raw=_remote_like)
@example(raw="HTTP://GITHUB.COM/0.git.git")  # found by this test: one ".git" stripped, not both
def test_fuzz_parse_remote_only_raises_invalid_remote(raw: str) -> None:
    pol = RemotePolicy(resolve=FakeResolver(_FUZZ_DNS), local_roots=(Path("/tmp"),))
    try:
        remote = parse_remote(raw, pol)
    except InvalidRemote as exc:
        assert "\n" not in str(exc) and str(exc)
        return
    assert remote.scheme in ALLOWED_SCHEMES
    for ip in remote.pinned_addresses:
        check_address(ip, RemotePolicy())  # raises if a refused address got through
    if remote.scheme == "file":
        assert remote.pinned_addresses == () and remote.url.startswith("/tmp")
    else:
        assert remote.host and "@" not in (remote.host or "")
        authority = remote.url.split("://", 1)[1].split("/", 1)[0]
        if remote.scheme == "ssh":
            assert "pass@" not in authority  # ssh user allowed, password never
        else:
            assert "@" not in authority  # no userinfo at all for http(s)/git
        # Canonical form is a fixed point.
        assert parse_remote(remote.url, pol).url == remote.url


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(raw=st.one_of(st.text(max_size=40), st.lists(_fragments, max_size=6).map("".join)))
def test_fuzz_normalise_branch_only_raises_invalid_remote(raw: str) -> None:
    try:
        name = normalise_branch(raw)
    except InvalidRemote:
        return
    assert not name.startswith("-") and ".." not in name and "@{" not in name
    assert all(ch.isprintable() and not ch.isspace() for ch in name)


@pytest.mark.parametrize(
    "raw",
    [
        # scp-style gains "ssh://" and a slash: 2,048 typed, 2,054 normalised.
        "git@github.com:" + "a" * (2048 - len("git@github.com:")),
        # one character under the limit as typed, still past it normalised.
        "git@github.com:" + "a" * (2047 - len("git@github.com:")),
    ],
)
def test_a_url_that_normalises_past_the_limit_is_refused(raw: str, policy: RemotePolicy) -> None:
    """The repository's columns hold 2,048 characters (PostgreSQL refused the insert)."""
    assert len(raw) <= 2048
    assert "2048 characters once normalised" in refused(raw, policy)


def test_the_longest_url_that_normalises_within_the_limit_is_accepted(
    policy: RemotePolicy,
) -> None:
    head = "ssh://git@github.com/"
    raw = "git@github.com:" + "a" * (2048 - len(head))
    remote = parse_remote(raw, policy)
    assert len(remote.url) == 2048 and len(remote.git_url()) <= 2048
