"""The HTTP side: the aiohttp application, request safety (limits, tokens, rejections) and the
browser overlay page.

May import: ``subd.sinks`` (the SSE sink it serves), ``subd.layout`` and the top-level modules.
A sink never imports the server: the server mounts what a sink exposes.
"""
