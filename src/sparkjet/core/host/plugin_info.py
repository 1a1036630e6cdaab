"""What the plugin host records, and what it holds a plugin object and a source class to.

The categories of registered classes and the registration hook of each
(:data:`REGISTRATIONS`), a class a plugin registered (:class:`Registered`),
a loaded plugin with its status (:class:`PluginInfo`: in use, unavailable
or broken), and the checks :mod:`.manager` makes before it installs a
plugin (:func:`missing_requirements`, its ``sparkjet_requires``) and when
it registers a source class (:func:`check_accepts_start`). The contract
checks of every registered class are :mod:`.checks`.
"""

from __future__ import annotations

import enum
import importlib.util
import inspect
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sparkjet.core.errors import PluginError
from sparkjet.core.host import hookspecs
from sparkjet.core.host.contracts import Sink, SnapshotBackend, Source, StatefulTransform


class Category(enum.StrEnum):
    """What a registered class is; the value is how messages and ``sparkjet plugins`` name it."""

    SOURCE = "source"
    SINK = "sink"
    STATEFUL_TRANSFORM = "stateful transform"
    SNAPSHOT_BACKEND = "snapshot backend"


@dataclass(frozen=True)
class Registration:
    """A registration hook, the base class its classes must extend, and their category."""

    spec: Callable[..., None]
    base: type
    category: Category


REGISTRATIONS = (
    Registration(hookspecs.register_sources, Source, Category.SOURCE),
    Registration(hookspecs.register_sinks, Sink, Category.SINK),
    Registration(
        hookspecs.register_stateful_transforms, StatefulTransform, Category.STATEFUL_TRANSFORM
    ),
    Registration(
        hookspecs.register_snapshot_backends, SnapshotBackend, Category.SNAPSHOT_BACKEND
    ),
)
BASES = {registration.category: registration.base for registration in REGISTRATIONS}


@dataclass(frozen=True)
class Registered:
    """A class contributed by a plugin."""

    #: The registered class.
    cls: type[Any]
    #: The name of the plugin that registered it.
    plugin: str
    #: What it is: a source, a sink, a stateful transform or a snapshot backend.
    category: Category

    @property
    def kind(self) -> str:
        """The class's ``kind``: the name it is selected by."""
        return str(self.cls.kind)


@dataclass
class PluginInfo:
    """One loaded plugin: where it came from and what it registered."""

    #: The plugin's name (its entry point's name).
    name: str
    #: "built-in", "<distribution> <version> (entry point)" or "registered at runtime".
    origin: str
    #: What it registered, in order.
    registered: list[Registered] = field(default_factory=list)
    #: Why it is not in use, or None: a dependency its ``sparkjet_requires``
    #: names is not installed (the message says which and how to install it).
    #: An unavailable plugin registers nothing and none of its hooks run.
    unavailable: str | None = None
    #: Why it is broken, or None: the error that made sparkjet skip this entry
    #: point (it failed to import, implements a hook sparkjet does not define,
    #: raised in a registration hook, or registered a class that breaks its
    #: contract), naming the plugin and its distribution. A broken plugin
    #: registers nothing and none of its hooks run; a pipeline using one of
    #: its classes is refused at submit with this error.
    broken: str | None = None
    #: The exception behind :attr:`broken` (its cause chained), or None.
    error: BaseException | None = field(default=None, repr=False, compare=False)
    #: The module the plugin is (an entry point's module), or None: how a
    #: class is told to be this plugin's when the plugin registered nothing.
    module: str | None = field(default=None, repr=False, compare=False)

    @property
    def in_use(self) -> bool:
        """True unless the plugin is unavailable or broken."""
        return self.unavailable is None and self.broken is None

    def owns(self, cls: type[Any]) -> bool:
        """Whether ``cls`` is likely this plugin's: defined in its package.

        A third-party plugin's package is its module's top-level package (the
        entry point ``mypkg.hooks`` owns ``mypkg.sources.MySource``); a
        plugin inside sparkjet's own package (the built-ins) owns its own
        module and those below it.
        """
        if not self.module:
            return False
        inside_sparkjet = self.module.split(".")[0] == "sparkjet"
        package = self.module if inside_sparkjet else self.module.split(".")[0]
        return cls.__module__ == package or cls.__module__.startswith(package + ".")

    def block_hint(self) -> str:
        """How to skip this plugin without its error or warning: the switches that block it."""
        return block_hint(self.name)

    def status(self) -> str:
        """``unavailable: <why>``, ``broken: <error>``, or ``in use``."""
        if self.broken is not None:
            return f"broken: {self.broken}"
        if self.unavailable is not None:
            return f"unavailable: {self.unavailable}"
        return "in use"


def block_hint(name: str) -> str:
    """How to skip plugin ``name`` without its message: the two switches that block it."""
    return f'block it with SPARKJET_BLOCK_PLUGINS={name} or [plugins] disable = ["{name}"]'


def plugin_who(name: str, origin: str) -> str:
    """``plugin "name"``, and ``from <origin>`` unless the caller registered it at runtime."""
    if origin == "registered at runtime":
        return f'plugin "{name}"'
    return f'plugin "{name}" from {origin}'


#: The attribute by which a plugin names the modules it needs beyond sparkjet.
REQUIRES_ATTRIBUTE = "sparkjet_requires"


def missing_requirements(name: str, origin: str, plugin: object) -> str | None:
    """Why ``plugin`` cannot be used here, or None if every module it requires is installed.

    A plugin whose dependencies are an optional extra (contrib's Kafka plugin
    and confluent-kafka) declares ``sparkjet_requires = {"module": "install
    hint"}`` and imports those modules only when its classes are used; a
    missing one makes it unavailable, listed with the hint, instead of
    failing ``connect()`` for every other plugin.
    """
    requires = getattr(plugin, REQUIRES_ATTRIBUTE, None)
    if requires is None:
        return None
    if not isinstance(requires, Mapping) or not all(
        isinstance(k, str) and k and isinstance(v, str) for k, v in requires.items()
    ):
        raise PluginError(
            f'plugin "{name}" from {origin}: {REQUIRES_ATTRIBUTE} must map module names to '
            f"install hints (strings), got {requires!r}"
        )
    missing = []
    for module, hint in requires.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a parent package missing, or a blocked import
            found = False
        if not found:
            missing.append(f"{module} ({hint})" if hint else module)
    if not missing:
        return None
    return f"needs {', '.join(missing)}, which is not installed"


def check_accepts_start(where: str, cls: type[Any]) -> None:
    """Hold a source's ``accepts_start`` declaration to its ``latest_offsets`` signature.

    The declaration decides whether the micro-batch loop passes ``start``;
    the signature is read here only to refuse a declaration the method cannot
    honour, and to keep sources written for the old convention (a ``start``
    parameter and no declaration, before 0.2) working for one release.
    """
    declared = getattr(cls, "accepts_start", False)
    if not isinstance(declared, bool):
        raise PluginError(
            f"{where}: source {cls.__qualname__} declares accepts_start = {declared!r}; "
            "it must be True or False"
        )
    if not getattr(cls, "streaming", False):
        return
    try:
        parameters = inspect.signature(cls.latest_offsets).parameters
    except (TypeError, ValueError):  # a C callable, say: take the declaration as it is
        return
    takes_start = "start" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )
    if declared and not takes_start:
        raise PluginError(
            f"{where}: source {cls.__qualname__} declares accepts_start = True, but its "
            f"latest_offsets({', '.join(parameters)}) has no 'start' "
            "parameter: define latest_offsets(self, context, start=None), or drop the declaration"
        )
    if not declared and "start" in parameters:
        warnings.warn(
            f"{where}: source {cls.__module__}.{cls.__qualname__}.latest_offsets takes 'start' "
            "but the class does not declare accepts_start = True; sparkjet passes start to it "
            "for now, but from the next release only a declared source gets it: add "
            f"'accepts_start = True' to {cls.__qualname__}",
            DeprecationWarning,
            stacklevel=2,
        )
        cls.accepts_start = True
