"""Where an address lies in this process's memory map (tests of what is mapped from a file)."""

from __future__ import annotations


def mapped_file(address: int) -> str | None:
    """The file mapped at ``address`` in this process (/proc/self/maps), None if anonymous."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            start, end = (int(a, 16) for a in fields[0].split("-"))
            if start <= address < end:
                return fields[5].strip() if len(fields) > 5 else None
    return None
