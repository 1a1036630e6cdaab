"""The plugin manager: loads every plugin from entry points, collects registered classes.

Built-in plugins are entry points of the ``sparkjet`` distribution in the same
``sparkjet`` group third-party distributions use, loaded by the same code;
the core never names a plugin module. ``SPARKJET_DISABLE_PLUGIN_AUTOLOAD=1``
skips third-party entry points (built-ins still load);
``SPARKJET_BLOCK_PLUGINS=a,b`` (and ``[plugins] disable``) blocks plugins by
name, built-ins included; ``SPARKJET_TRACE_HOOKS=1`` logs every hook call to
the ``sparkjet.hooks`` logger at DEBUG level.

The core calls hooks through :class:`PluginHost`'s typed methods, one per
hook (as tox 4's plugin manager does), never by a hook's name.
"""

from __future__ import annotations

import enum
import importlib.metadata
import importlib.util
import inspect
import logging
import os
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pluggy

from sparkjet.core.errors import PluginError
from sparkjet.core.host import hookspecs
from sparkjet.core.host.contracts import Sink, SnapshotBackend, Source, StatefulTransform
from sparkjet.core.host.hookspecs import JobView, ManifestView
from sparkjet.core.model import JobStatus, ProcessingGuarantee

log = logging.getLogger("sparkjet.plugins")

ENTRY_POINT_GROUP = "sparkjet"
ENV_DISABLE_AUTOLOAD = "SPARKJET_DISABLE_PLUGIN_AUTOLOAD"
ENV_BLOCK = "SPARKJET_BLOCK_PLUGINS"
ENV_TRACE = "SPARKJET_TRACE_HOOKS"

#: The distribution whose entry points are the built-in plugins.
BUILTIN_DISTRIBUTION = "sparkjet"


class Category(enum.StrEnum):
    """What a registered class is; the value is how messages and ``sparkjet plugins`` name it."""

    SOURCE = "source"
    SINK = "sink"
    STATEFUL_TRANSFORM = "stateful transform"
    SNAPSHOT_BACKEND = "snapshot backend"


@dataclass(frozen=True)
class _Registration:
    """A registration hook, the base class its classes must extend, and their category."""

    spec: Callable[..., None]
    base: type
    category: Category


_REGISTRATIONS = (
    _Registration(hookspecs.register_sources, Source, Category.SOURCE),
    _Registration(hookspecs.register_sinks, Sink, Category.SINK),
    _Registration(
        hookspecs.register_stateful_transforms, StatefulTransform, Category.STATEFUL_TRANSFORM
    ),
    _Registration(
        hookspecs.register_snapshot_backends, SnapshotBackend, Category.SNAPSHOT_BACKEND
    ),
)


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


def _normalized(distribution: str) -> str:
    return distribution.lower().replace("_", "-").replace(".", "-")


def _is_truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


#: The attribute by which a plugin names the modules it needs beyond sparkjet.
REQUIRES_ATTRIBUTE = "sparkjet_requires"


def _missing_requirements(name: str, origin: str, plugin: object) -> str | None:
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


def _check_accepts_start(where: str, cls: type[Any]) -> None:
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


class PluginHost:
    """Owns the pluggy manager of one client and the classes plugins registered."""

    def __init__(self, disable: Iterable[str] = (), *, autoload: bool | None = None) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        if _is_truthy(os.environ.get(ENV_TRACE)):
            self.pm.trace.root.setwriter(logging.getLogger("sparkjet.hooks").debug)
            self.pm.enable_tracing()
        env_block = [n.strip() for n in os.environ.get(ENV_BLOCK, "").split(",") if n.strip()]
        self.blocked: set[str] = set(disable) | set(env_block)
        self.plugins: dict[str, PluginInfo] = {}
        self._by_kind: dict[tuple[Category, str], Registered] = {}
        self._by_class: dict[type[Any], Registered] = {}
        if autoload is None:
            autoload = not _is_truthy(os.environ.get(ENV_DISABLE_AUTOLOAD))
        self._load_entry_points(third_party=autoload)
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            # pluggy's error carries the plugin object, not its name.
            name = self.pm.get_name(exc.plugin) or repr(exc.plugin)
            info = self.plugins.get(name)
            origin = f" from {info.origin}" if info is not None else ""
            raise PluginError(
                f'plugin "{name}"{origin} implements a hook sparkjet does not define: {exc}'
            ) from exc
        for name, info in list(self.plugins.items()):
            if info.unavailable is None:
                self._collect(name)

    # --- loading ---------------------------------------------------------

    def _load_entry_points(self, third_party: bool) -> None:
        builtins: list[importlib.metadata.EntryPoint] = []
        others: list[importlib.metadata.EntryPoint] = []
        seen: set[tuple[str, str]] = set()
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            if (ep.name, ep.value) in seen:  # one distribution seen twice on sys.path
                continue
            seen.add((ep.name, ep.value))
            owner = ep.dist.name if ep.dist is not None else ""
            (builtins if _normalized(owner) == BUILTIN_DISTRIBUTION else others).append(ep)
        if not builtins:
            raise PluginError(
                "sparkjet's built-in plugins are missing: the installed 'sparkjet' distribution "
                f"declares no entry points in group '{ENTRY_POINT_GROUP}'; reinstall sparkjet "
                "(pip install sparkjet, or pip install -e . in a source checkout)"
            )
        for ep in builtins:
            self._load(ep.name, ep.load, "built-in")
        for ep in others if third_party else ():
            dist = ep.dist
            origin = f"{dist.name} {dist.version} (entry point)" if dist else "entry point"
            if ep.name in self.plugins:
                raise PluginError(
                    f'plugin name "{ep.name}" from {origin} is already taken by '
                    f"{self.plugins[ep.name].origin}"
                )
            self._load(ep.name, ep.load, origin)

    def _load(self, name: str, load: Callable[[], Any], origin: str) -> None:
        if name in self.blocked:
            log.debug("plugin %s (%s) is blocked", name, origin)
            return
        try:
            plugin = load()
        except Exception as exc:
            raise PluginError(f'Error importing plugin "{name}" from {origin}: {exc!r}') from exc
        missing = _missing_requirements(name, origin, plugin)
        if missing is not None:
            log.info("plugin %s (%s) is unavailable: %s", name, origin, missing)
            self.plugins[name] = PluginInfo(name, origin, unavailable=missing)
            return
        try:
            self.pm.register(plugin, name=name)
        except ValueError as exc:
            raise PluginError(f'cannot register plugin "{name}" from {origin}: {exc}') from exc
        except pluggy.PluginValidationError as exc:
            raise PluginError(f'plugin "{name}" from {origin} is invalid: {exc}') from exc
        self.plugins[name] = PluginInfo(name, origin)

    def register(self, plugin: object, name: str) -> None:
        """Register a plugin object at runtime (scripts, tests, notebooks)."""
        if name in self.plugins:
            raise PluginError(f'a plugin named "{name}" is already registered')
        self._load(name, lambda: plugin, "registered at runtime")
        if name in self.plugins and self.plugins[name].unavailable is None:
            try:
                self.pm.check_pending()
            except pluggy.PluginValidationError as exc:
                self.pm.unregister(name=name)
                del self.plugins[name]
                raise PluginError(
                    f'plugin "{name}" implements a hook sparkjet does not define: {exc}'
                ) from exc
            try:
                self._collect(name)
            except PluginError:
                self._forget(name)
                raise

    def _forget(self, name: str) -> None:
        """Undo a runtime registration that failed half-way: nothing of it stays."""
        self.pm.unregister(name=name)
        info = self.plugins.pop(name, None)
        for entry in info.registered if info is not None else ():
            if self._by_kind.get((entry.category, entry.kind)) is entry:
                del self._by_kind[(entry.category, entry.kind)]
            if self._by_class.get(entry.cls) is entry:
                del self._by_class[entry.cls]

    def _collect(self, name: str) -> None:
        """Call the registration hooks of one plugin and record what it registers."""
        others = [p for p in self.pm.get_plugins() if self.pm.get_name(p) != name]
        for registration in _REGISTRATIONS:
            hook_name = registration.spec.__name__
            caller = self.pm.subset_hook_caller(hook_name, remove_plugins=others)

            def register(cls: Any, *, _registration: _Registration = registration) -> None:
                self._add(name, cls, _registration)

            try:
                caller(register=register)
            except PluginError:
                raise
            except Exception as exc:
                raise PluginError(f'plugin "{name}" failed in {hook_name}: {exc!r}') from exc

    def _add(self, plugin: str, cls: Any, registration: _Registration) -> None:
        where = f'plugin "{plugin}"'
        base, category = registration.base, registration.category
        if not isinstance(cls, type) or not issubclass(cls, base):
            raise PluginError(
                f"{where} registered {cls!r} as a {category}, but it is not a subclass of "
                f"sparkjet.plugin.{base.__name__}"
            )
        kind = getattr(cls, "kind", None)
        if not isinstance(kind, str) or not kind:
            raise PluginError(f"{where}: {category} {cls.__qualname__} has no 'kind' string")
        guarantees: Any = getattr(cls, "guarantees", frozenset())
        if category is not Category.SNAPSHOT_BACKEND and (
            not isinstance(guarantees, frozenset | set)
            or not guarantees
            or not all(isinstance(g, ProcessingGuarantee) for g in guarantees)
        ):
            raise PluginError(
                f"{where}: {category} {cls.__qualname__} must declare 'guarantees' as a "
                f"non-empty set of ProcessingGuarantee"
            )
        if category is Category.SOURCE:
            _check_accepts_start(where, cls)
        existing = self._by_kind.get((category, kind))
        if existing is not None and existing.cls is not cls:
            raise PluginError(
                f'{where} registers {category} kind "{kind}" ({cls.__module__}.'
                f'{cls.__qualname__}), already registered by plugin "{existing.plugin}" '
                f"({existing.cls.__module__}.{existing.cls.__qualname__})"
            )
        entry = Registered(cls, plugin, category)
        self._by_kind[(category, kind)] = entry
        self._by_class[cls] = entry
        self.plugins[plugin].registered.append(entry)

    # --- queries -----------------------------------------------------------

    def lookup_class(self, cls: type[Any]) -> Registered | None:
        """Find the registration of ``cls`` (or of its nearest registered base)."""
        for klass in cls.__mro__:
            entry = self._by_class.get(klass)
            if entry is not None:
                return entry
        return None

    def lookup_kind(self, category: Category, kind: str) -> Registered:
        """The class of ``category`` registered as ``kind``; PluginError naming the known ones."""
        entry = self._by_kind.get((category, kind))
        if entry is None:
            known = sorted(k for (c, k) in self._by_kind if c == category)
            raise PluginError(
                f'no {category} of kind "{kind}" is registered (known: {", ".join(known)}); '
                "is its plugin installed and not blocked?"
            )
        return entry

    # --- calling hooks: one typed method per hook ------------------------------

    def spark_session_building(self, *, builder: Any, spark_conf: Mapping[str, str]) -> None:
        """Let plugins adjust the Spark session (``before_spark_session_created``).

        ``builder`` is the ``SparkSession.Builder``. A plugin's error propagates:
        the session is not built on settings a plugin failed to make.
        """
        self.pm.hook.before_spark_session_created(builder=builder, spark_conf=dict(spark_conf))

    def job_status_changed(
        self, *, job: JobView, old_status: JobStatus, new_status: JobStatus
    ) -> None:
        """Tell plugins a job changed status (``on_job_status_changed``)."""
        self._observe(
            hookspecs.on_job_status_changed, job=job, old_status=old_status, new_status=new_status
        )

    def job_error(self, *, job: JobView, error: BaseException) -> None:
        """Tell plugins a job is failing with ``error`` (``on_job_error``)."""
        self._observe(hookspecs.on_job_error, job=job, error=error)

    def snapshot_exported(
        self, *, job: JobView, name: str, manifest: ManifestView, cancel_job: bool
    ) -> None:
        """Tell plugins snapshot ``name`` was exported from ``job`` (``on_snapshot_exported``)."""
        self._observe(
            hookspecs.on_snapshot_exported,
            job=job, name=name, manifest=manifest, cancel_job=cancel_job,
        )

    def _observe(self, spec: Callable[..., None], **kwargs: Any) -> None:
        """Call the lifecycle hook ``spec``; plugin errors are logged, never propagated.

        Each plugin is called on its own, so one that raises does not keep the
        others from being told.
        """
        hook_name = spec.__name__
        hook = getattr(self.pm.hook, hook_name)
        plugins = self.pm.get_plugins()
        for impl in reversed(hook.get_hookimpls()):  # pluggy's order: last registered first
            others = [p for p in plugins if p is not impl.plugin]
            try:
                self.pm.subset_hook_caller(hook_name, remove_plugins=others)(**kwargs)
            except Exception:
                log.exception('plugin "%s" failed in %s', impl.plugin_name, hook_name)
