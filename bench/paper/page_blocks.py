"""Generated blocks in Markdown pages: the text between a ``begin`` and an ``end`` marker comment, replaced whole."""

import re


def fill_block(text: str, begin: str, end: str, content: str) -> str:
    """``text`` with the block between ``begin`` and ``end`` replaced by ``content`` (the markers kept)."""
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise ValueError(f"no block {begin} ... {end}")
    return pattern.sub(lambda _m: f"{begin}\n{content.rstrip()}\n{end}", text)
