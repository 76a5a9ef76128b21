"""The clone's ``custom_generate`` entry: ``custom_generate="<clone>/hub"`` runs the installed
``lookahead_core`` (``pip install -e <clone>``). The Hub repository's folder is built by
``make hub HUB_OUT=<folder>`` (hub/build.py) and carries the decoder itself; both call
:func:`lookahead_core.generate.generate`, which documents the options and what is honoured and refused.
"""

try:                # (in a try: transformers' import check would advise `pip install lookahead_core`, which no registry serves)
    from lookahead_core.generate import generate
except ModuleNotFoundError as error:
    raise ImportError("custom_generate=<clone>/hub runs the installed decoder: pip install -e <clone> (or load the "
                      "folder `make hub HUB_OUT=<folder>` builds, which carries it)") from error

__all__ = ["generate"]
