"""Option descriptions from signatures and docstrings (fedaug.core.options): an ``Args:`` entry that only points at
another class keeps that class's text for the option."""

from __future__ import annotations

from fedaug.core.options import describe_options


class Base:
    """A base with its options described.

    Args:
        weighting: how clients are weighted.
        bn: what happens to BatchNorm statistics.
    """

    def __init__(self, *, weighting: str = "samples", bn: str = "average") -> None:
        self.weighting, self.bn = weighting, bn


class Sub(Base):
    """A subclass that describes one option itself and points at its base for the other.

    Args:
        weighting: the p_i of the server's step.
        bn: as :class:`~tests.core.test_options.Base`.
        extra: as Base.
    """

    def __init__(self, *, weighting: str = "samples", bn: str = "average", extra: int = 0) -> None:
        super().__init__(weighting=weighting, bn=bn)
        self.extra = extra


def helps(cls: type) -> dict[str, str]:
    return {o.name: o.help for o in describe_options(cls.__init__, docs=cls.__mro__)}


def test_a_pointer_entry_keeps_the_text_of_the_class_it_points_at():
    assert helps(Base) == {"weighting": "how clients are weighted.", "bn": "what happens to BatchNorm statistics."}
    assert helps(Sub) == {"weighting": "the p_i of the server's step.", "bn": "what happens to BatchNorm statistics.",
                          "extra": ""}  # a pointer with nothing behind it describes nothing
