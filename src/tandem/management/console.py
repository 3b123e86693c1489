"""The web console (docs/console.md): static files served by the management listener at `/`.

Plain HTML, CSS and JavaScript (decision 0070): nothing to build, nothing fetched from the
internet. The files are public (the login page must load before anyone logs in); everything
they show comes from /api, with its own authentication and permission checks.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

CONSOLE_DIR = Path(__file__).parent / "console"
ASSETS = "/console"  # app.js, style.css

# The page runs only its own files and talks only to its own origin; no framing (clickjacking).
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",  # revalidated (ETag, Last-Modified): an upgraded broker serves its new console
}


def is_console_path(path: str) -> bool:
    """A path of the console's files: public, unlike /api."""
    return path == "/" or path.startswith(ASSETS + "/")


async def _index(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(CONSOLE_DIR / "index.html")


async def _headers(request: web.Request, response: web.StreamResponse) -> None:
    if is_console_path(request.path):
        response.headers.update(HEADERS)


def add_console(app: web.Application) -> None:
    """Serve the console from `app`: `/` and its files under /console/."""
    app.router.add_get("/", _index)
    app.router.add_static(ASSETS, CONSOLE_DIR, follow_symlinks=False)
    app.on_response_prepare.append(_headers)
