"""dusk's exceptions. Every entry point checks its arguments before anything runs and
raises ``InvalidArgument`` naming the one at fault."""


class DuskError(Exception):
    """Base of every error dusk raises."""


class InvalidArgument(DuskError, ValueError):
    """A bad argument (shape, dtype, device, contiguity, index range, parameter value),
    found before anything was launched. ``arg`` names it; ``expected`` and ``found`` say
    what was wanted and what was given (``None`` where not known)."""

    def __init__(self, message, arg=None, expected=None, found=None):
        super().__init__(message)
        self.arg = arg
        self.expected = expected
        self.found = found


class NotInBundle(DuskError, RuntimeError):
    """On a GPU: a kernel the plan needs is not in the bundle of ahead-of-time PTX this
    build carries (and it cannot compile PTX: no LLVM). Point ``DUSK_BUNDLE`` at a bundle
    that holds it (``cargo dusk compile``), or build the extension with ``--features jit``."""


class DeviceError(DuskError, RuntimeError):
    """The CUDA driver or the CPU interpreter failed (no GPU, a launch error, an access
    out of bounds caught by the interpreter)."""
