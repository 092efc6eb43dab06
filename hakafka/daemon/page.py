"""The status page the admin endpoint serves at `/`: one self-contained HTML file
(`page.html`: inline CSS and JavaScript, charts drawn as inline SVG, no external asset)
that polls `/status` and `/status/history` on its own origin every 2 s."""

from __future__ import annotations

from importlib.resources import files


def status_page() -> bytes:
    """The page's bytes, shipped in the package next to this module."""
    return files("hakafka.daemon").joinpath("page.html").read_bytes()
