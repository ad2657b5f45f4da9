"""The packages some Paddle releases need held below a major version.

Read by setup.py (without importing paddle_ext: a build may have no Paddle importable from
the package) to pin them at install, and by `python -m paddle_ext doctor` to check them
afterwards, since a later `pip install` can lift them again. Standard library only.
"""

from __future__ import annotations

# Paddle major.minor -> (package, first major version it breaks with, what breaks), measured
_PROTOBUF_LABEL = ("protobuf", 7, "DistributedStrategy reads FieldDescriptor.label, which protobuf 7 removed: "
                   "every fleet strategy fails ('hybrid_configs is not a attribute of DistributedStrategy')")
PINS: dict[str, tuple[tuple[str, int, str], ...]] = {
    "2.6": (("protobuf", 5, "DistributedStrategy breaks with protobuf 5"),
            ("numpy", 2, "a rank that raises inside a pipeline step segfaults instead of reporting its error")),
    "3.0": (_PROTOBUF_LABEL,),
    "3.1": (_PROTOBUF_LABEL,),
    "3.2": (_PROTOBUF_LABEL,),
}


def pins_for(paddle_version: str) -> tuple[tuple[str, int, str], ...]:
    """The pins for a Paddle version string ("3.0.0", "2.6.2", ...)."""
    return PINS.get(".".join(paddle_version.split(".")[:2]), ())


def install_requirements(paddle_version: str) -> list[str]:
    """pip requirement strings for those pins (protobuf also at least 3.20, as Paddle asks)."""
    return [f"{name}>=3.20,<{major}" if name == "protobuf" else f"{name}<{major}"
            for name, major, _ in pins_for(paddle_version)]


def unmet(paddle_version: str, installed: dict[str, str]) -> list[str]:
    """Messages for the pins an environment breaks; `installed` maps package -> version."""
    out = []
    for name, major, why in pins_for(paddle_version):
        have = installed.get(name)
        if have is not None and int(have.split(".")[0]) >= major:
            out.append(f"{name} {have} with Paddle {paddle_version}: {why}; pip install \"{name}<{major}\"")
    return out
