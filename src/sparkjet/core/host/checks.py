"""What a plugin's hooks and classes are held to when it registers, with a "did you mean".

A plugin's mistakes are cheapest found where it registers, not at submit or
fourteen seconds into a job: a hook name that is not a sparkjet hook
(:func:`unknown_hooks`), and a registered class whose methods are not its
contract's (:func:`contract_problems`): a public name one typo away from a
contract name it does not define (methods compared with methods, other
attributes with attributes), an abstract method left out, a streaming
source without its offset methods, or one that implements them but forgot
``streaming = True``. Near-misses are found with :mod:`difflib` over the
contract's names, and only for a contract name the class does not define
itself, so a helper method beside the real one (``partition`` beside
``partitions``) is never taken for a typo.
"""

from __future__ import annotations

import difflib
import dis
import inspect
from collections.abc import Iterable
from typing import Any

from sparkjet.core.host import hookspecs
from sparkjet.core.host.contracts import Source

#: How close a name must be to a contract name to be taken for a typo of it (difflib's ratio).
CUTOFF = 0.8

#: What a streaming job reads a source with (besides ``read``).
STREAMING_METHODS = ("initial_offsets", "latest_offsets", "plan_range")

#: The contracts' own modules: a class defined there is a base, not a plugin's.
_CONTRACTS_PACKAGE = "sparkjet.core.host.contracts"

#: Every hook sparkjet defines, by name.
HOOK_NAMES: tuple[str, ...] = tuple(sorted(
    name for name, value in vars(hookspecs).items()
    if callable(value) and hasattr(value, f"{hookspecs.PROJECT}_spec")
))


def did_you_mean(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate ``name`` is most likely a typo of, or None if none is close."""
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=CUTOFF)
    return close[0] if close else None


def unknown_hooks(hook_names: Iterable[str]) -> str | None:
    """Why some of ``hook_names`` (a plugin's hook implementations) are not sparkjet hooks.

    None when all are; else each unknown name, with the sparkjet hook it is
    most likely a typo of: ``register_source (did you mean 'register_sources'?)``.
    """
    unknown = []
    for name in sorted(set(hook_names) - set(HOOK_NAMES)):
        guess = did_you_mean(name, HOOK_NAMES)
        unknown.append(f"{name} (did you mean {guess!r}?)" if guess else name)
    if not unknown:
        return None
    noun = "a hook" if len(unknown) == 1 else "hooks"
    return (f"implements {noun} sparkjet does not define: {', '.join(unknown)}; "
            f"sparkjet's hooks are {', '.join(HOOK_NAMES)}")


def _is_contract(klass: type) -> bool:
    return klass.__module__.startswith(_CONTRACTS_PACKAGE)


def _public_names(classes: Iterable[type], *, methods: bool) -> set[str]:
    """The public names ``classes`` define: their methods, or (``methods=False``) the rest."""
    return {
        name for klass in classes for name, value in vars(klass).items()
        if not name.startswith("_") and _is_method(value) is methods
    }


def _is_method(value: Any) -> bool:
    return inspect.isfunction(value) or isinstance(value, staticmethod | classmethod)


def only_raises_not_implemented(fn: Any) -> bool:
    """Whether ``fn`` does nothing but ``raise NotImplementedError(...)`` (a stream-only stub).

    Read from its byte code, so it works for classes whose source is not at
    hand; anything that can return, or names anything else, is real code.
    """
    code = getattr(fn, "__code__", None)
    if code is None or code.co_names != ("NotImplementedError",):
        return False
    ops = {instruction.opname for instruction in dis.get_instructions(code)}
    return "RAISE_VARARGS" in ops and not any(op.startswith(("RETURN", "YIELD")) for op in ops)


def _overrides(cls: type, name: str, base: type) -> bool:
    return getattr(cls, name, None) is not getattr(base, name, None)


def contract_problems(cls: type, base: type, *, streaming: bool) -> list[str]:
    """What is wrong with ``cls`` as a ``base`` (a Source, a Sink, ...): one phrase per problem.

    Each phrase completes "<category> <class> ...": ``defines 'lastest_offsets';
    did you mean 'latest_offsets'?``. ``streaming`` is whether the source
    runs as a streaming one (its class's declaration at registration, the
    instance's at submit). Empty when nothing is wrong.
    """
    own = [k for k in cls.__mro__ if issubclass(k, base) and not _is_contract(k)]
    contracts = [k for k in cls.__mro__ if _is_contract(k)]
    problems: list[str] = []
    meant: set[str] = set()
    for methods in (True, False):  # a method is no typo of an attribute, nor the reverse
        contract_names = _public_names(contracts, methods=methods)
        defined = _public_names(own, methods=True) | _public_names(own, methods=False)
        for name in sorted(_public_names(own, methods=methods) - contract_names):
            guess = did_you_mean(name, contract_names - defined)
            if guess is not None:
                meant.add(guess)
                problems.append(f"defines {name!r}; did you mean {guess!r}?")
    abstract = sorted(getattr(cls, "__abstractmethods__", ()))
    if issubclass(base, Source):
        overridden = [m for m in STREAMING_METHODS if _overrides(cls, m, Source)]
        if streaming:
            missing = [m for m in STREAMING_METHODS if m not in overridden and m not in meant]
            if missing:
                problems.append(
                    f"declares streaming = True but does not implement {', '.join(missing)}, "
                    "which a streaming job reads offsets with"
                )
        elif overridden and ("partitions" in abstract
                             or only_raises_not_implemented(getattr(cls, "partitions", None))):
            problems.append(
                f"implements streaming methods ({', '.join(overridden)}) but does not declare "
                "`streaming = True`: without it a job reads it as a batch source, by "
                "partitions(), which it does not implement; add `streaming = True` to the class"
            )
            abstract = [m for m in abstract if m != "partitions"]
    missing_abstract = [m for m in abstract if m not in meant]
    if missing_abstract:
        problems.append(
            f"does not implement {', '.join(missing_abstract)}, abstract in "
            f"sparkjet.plugin.{_defining_base(cls, missing_abstract[0], contracts)}"
        )
    return problems


def _defining_base(cls: type, name: str, contracts: list[type]) -> str:
    for klass in reversed(contracts):  # the most derived contract that declares it abstract
        if getattr(vars(klass).get(name), "__isabstractmethod__", False):
            return klass.__name__
    return cls.__mro__[1].__name__  # pragma: no cover - every abstract name is some base's


def describe_problems(category: str, cls: type, problems: list[str]) -> str:
    """``problems`` of ``cls`` as sentences: ``source Foo defines ...? It also ...``."""
    first, *more = problems
    return " ".join([f"{category} {cls.__qualname__} {first}",
                     *(f"It also {problem}" for problem in more)])

