"""Which Paddle release is running, and the one test every version difference is written with.

`paddle_before(major, minor)` is the only comparison of Paddle's version in paddle_ext: the
other compat modules ask it (or a named predicate built on it), and nothing outside
paddle_ext.compat reads the version at all (tests/test_version_reads.py checks that).
"""

from __future__ import annotations

import functools

SUPPORTED = ((2, 6), (3, 0), (3, 1), (3, 2), (3, 3))

DEVELOP = (0, 0, 0)
"""What paddle_version() reads for a develop build (__version__ '0.0.0'): the newest API."""


@functools.cache
def paddle_version() -> tuple[int, int, int]:
    """The running Paddle's (major, minor, patch); digits only ('3.0.0rc1' is (3, 0, 0))."""
    import paddle

    parts = paddle.__version__.split(".")[:3]
    nums = []
    for p in parts:
        digits = "".join(ch for ch in p if ch.isdigit())
        nums.append(int(digits) if digits else 0)
    while len(nums) < 3:
        nums.append(0)
    return tuple(nums)  # type: ignore[return-value]


def version_string() -> str:
    """Paddle's __version__ as it is ('3.3.1', '0.0.0' for a develop build)."""
    import paddle

    return paddle.__version__


def paddle_before(major: int, minor: int) -> bool:
    """Whether the running Paddle is older than `major.minor` (3.0.0rc1 is not before 3.0).
    A develop build (0.0.0) has the newest API, so it is before no release."""
    version = paddle_version()
    return version != DEVELOP and version[:2] < (major, minor)


def is_supported(version: tuple[int, int, int] | None = None) -> bool:
    """Whether `version` (default: the running one) is a release paddle_ext supports."""
    v = version or paddle_version()
    # 0.0.0 is a develop build: assume the newest API.
    return v[:2] in SUPPORTED or v == DEVELOP


def is_running_release(version: str) -> bool:
    """Whether `version` (a Paddle __version__ recorded elsewhere, such as the op library's
    build info) names the running Paddle exactly: a library built against another release
    (even a patch release) may not load, or may misbehave, against this one."""
    return version == version_string()


def release_description() -> str:
    """The running Paddle as the doctor shows it: release, build, commit, whether supported."""
    import paddle

    from paddle_ext import devices

    supported = "supported" if is_supported() else "NOT a supported release (2.6.2, 3.0-3.3.x)"
    commit = getattr(paddle.version, "commit", "?")[:12]
    return f"Paddle {version_string()} ({devices.device_build()} build, commit {commit}): {supported}"


def dependency_problems() -> list[str]:
    """What the installed packages break in this Paddle release (paddle_ext._requirements:
    the pins setup.py sets at install, which a later pip install can lift)."""
    from importlib import metadata

    from paddle_ext import _requirements

    installed = {}
    for name, _, _ in _requirements.pins_for(version_string()):
        try:
            installed[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return _requirements.unmet(version_string(), installed)
