"""Template filters and tags: `gitward` (relative times, short ids, counts, the rows of the
longest tables; loaded as a builtin by settings) and `patches` (a commit's patch as escaped
lines, classed as added, removed or header)."""
