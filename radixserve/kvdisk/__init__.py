"""The disk tier under the radix prefix cache (issue 59): pages the pool evicts, and the warm
part of the tree at shutdown, kept as files and read back on a later radix miss.

    store.py        the page files: header, checksum, atomic writes, size budget (torch-free)
    fingerprint.py  what changes a page's numbers: the folder a model's pages go to
    tier.py         the core's spill/restore hooks over a store and the runner's page copies
    setup.py        the tier from the engine's config (engine/build.py), or why it is off
    args.py         the flags and serve's default folder and budget (torch-free)
    stats.py        its counters in the engine's stats and at /metrics (torch-free)

The core sees only core/kv/disk_hooks.py; the pool's bytes move in runner/kv_pages.py.
"""
