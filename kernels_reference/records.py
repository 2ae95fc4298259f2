"""Reference modules remember their constructor arguments.

Composed mode swaps a reference child (an RMSNorm inside a decoder layer) for the candidate's
class: it must build the candidate with the same arguments the reference child was built with.
"""
import functools
import inspect


class RecordsInit:
    """Mixin: after ``__init__``, ``self.init_args`` holds the bound constructor arguments.

    Defaults are recorded too (a candidate must be built as the reference was, not with its own
    defaults), except those a class names in ``RECORDED_WHEN_PASSED``: production options (a
    row-parallel layer's ``reduce_results``) that a candidate written against the single-GPU
    signature need not accept while they keep their default."""

    RECORDED_WHEN_PASSED: tuple = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is None:
            return
        signature = inspect.signature(init)

        @functools.wraps(init)
        def recording_init(self, *args, **kw):
            bound = signature.bind(self, *args, **kw)
            passed = set(bound.arguments)
            bound.apply_defaults()
            init(self, *args, **kw)
            arguments = {k: v for k, v in bound.arguments.items()
                         if k in passed or k not in type(self).RECORDED_WHEN_PASSED}
            arguments.pop("self", None)
            object.__setattr__(self, "init_args", arguments)  # the outermost class's call wins

        cls.__init__ = recording_init
