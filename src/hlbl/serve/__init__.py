"""``hlbl serve``: a trained run behind a JSON API, and a page to watch it predict and explore its tree.

:class:`~hlbl.serve.service.Service` holds the model and answers queries (no web code);
:func:`~hlbl.serve.app.create_app` puts it behind HTTP (Starlette), and :mod:`hlbl.serve.server`
runs that on uvicorn with limits on slow, idle and hostile connections. The web stack is the
optional ``serve`` extra: ``pip install 'hlbl[serve]'``. See docs/serve.md.
"""

from .service import Limits, NotFound, Service

__all__ = ["Limits", "NotFound", "Service", "create_app"]


def create_app(*args, **kwargs):
    """:func:`hlbl.serve.app.create_app` (imported on use: the web stack is optional)."""
    from .app import create_app as make

    return make(*args, **kwargs)
