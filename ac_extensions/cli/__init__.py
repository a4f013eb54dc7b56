"""Command-line tools: ``ac-train``, ``ac-eval`` and ``ac-plot``.

:mod:`.train`, :mod:`.evaluate` and :mod:`.plot`; nothing else in the package imports this one.
"""
