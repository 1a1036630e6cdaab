"""The plugin manager: loads every plugin from entry points, collects registered classes.

Built-in plugins are entry points of the ``sparkjet`` distribution in the same
``sparkjet`` group third-party distributions use, loaded by the same code;
the core never names a plugin module. ``SPARKJET_DISABLE_PLUGIN_AUTOLOAD=1``
skips third-party entry points (built-ins still load);
``SPARKJET_BLOCK_PLUGINS=a,b`` (and ``[plugins] disable``) blocks plugins by
name, built-ins included; ``SPARKJET_TRACE_HOOKS=1`` logs every hook call to
the ``sparkjet.hooks`` logger at DEBUG level.

An entry point that cannot be used is skipped, not fatal: one whose
``sparkjet_requires`` are not installed is *unavailable*; one that fails to
import, implements a hook sparkjet does not define, raises in a registration
hook or registers a class that breaks its contract (:mod:`.checks`) is
*broken*. Either is listed (:class:`PluginInfo`) and logged once, every other
plugin loads, and a pipeline using one of its classes is refused at submit
naming it (:meth:`PluginHost.participant`). What stays an error at
``connect()`` is what no skipping can settle: two plugins claiming one name
or one kind (which one a kind selects would depend on the order entry points
are found in), and no built-ins at all. A plugin registered at runtime
(:meth:`PluginHost.register`) raises at once: its caller is right there.

The core calls hooks through :class:`PluginHost`'s typed methods, one per
hook (as tox 4's plugin manager does), never by a hook's name.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import inspect
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pluggy

from sparkjet.core.errors import PipelineDefinitionError, PluginError
from sparkjet.core.host import checks, hookspecs
from sparkjet.core.host.hookspecs import JobView, ManifestView
from sparkjet.core.host.plugin_info import (
    BASES,
    REGISTRATIONS,
    Category,
    PluginInfo,
    Registered,
    Registration,
    block_hint,
    check_accepts_start,
    missing_requirements,
    plugin_who,
)
from sparkjet.core.model import JobStatus, ProcessingGuarantee

log = logging.getLogger("sparkjet.plugins")

ENTRY_POINT_GROUP = "sparkjet"
ENV_DISABLE_AUTOLOAD = "SPARKJET_DISABLE_PLUGIN_AUTOLOAD"
ENV_BLOCK = "SPARKJET_BLOCK_PLUGINS"
ENV_TRACE = "SPARKJET_TRACE_HOOKS"

#: The distribution whose entry points are the built-in plugins.
BUILTIN_DISTRIBUTION = "sparkjet"


class _Conflict(PluginError):
    """Two plugins claim one name or one kind: an error at ``connect()``, never a skip."""


#: The broken plugins already warned about in this process: a warning once, not per client.
_WARNED: set[tuple[str, str, str]] = set()


def _normalized(distribution: str) -> str:
    return distribution.lower().replace("_", "-").replace(".", "-")


def _is_truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


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
        #: The entry points found but blocked, to name them when a pipeline uses their classes.
        self._blocked_found: dict[str, PluginInfo] = {}
        self._by_kind: dict[tuple[Category, str], Registered] = {}
        self._by_class: dict[type[Any], Registered] = {}
        if autoload is None:
            autoload = not _is_truthy(os.environ.get(ENV_DISABLE_AUTOLOAD))
        self._load_entry_points(third_party=autoload)
        for name, info in list(self.plugins.items()):
            if not info.in_use:
                continue
            try:
                self._collect(name)
            except _Conflict as exc:
                raise PluginError(
                    f"{exc}: one kind selects one class, so sparkjet cannot tell which is "
                    f"meant; uninstall one of them, or {block_hint(name)}"
                ) from exc
            except PluginError as exc:
                self._forget(name, keep_info=True)
                self._set_broken(info, exc)

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
            self._load_entry_point(ep, "built-in")
        for ep in others if third_party else ():
            dist = ep.dist
            origin = f"{dist.name} {dist.version} (entry point)" if dist else "entry point"
            if ep.name in self.plugins:
                raise PluginError(
                    f'plugin name "{ep.name}" from {origin} is already taken by '
                    f"{self.plugins[ep.name].origin}: uninstall one of them (blocking the "
                    "name would block both)"
                )
            self._load_entry_point(ep, origin)

    def _load_entry_point(self, ep: importlib.metadata.EntryPoint, origin: str) -> None:
        """Load one entry point; one that cannot be used is listed as unavailable or broken."""
        name = ep.name
        info = PluginInfo(name, origin, module=ep.module)
        if name in self.blocked:
            log.debug("plugin %s (%s) is blocked", name, origin)
            self._blocked_found[name] = info
            return
        self.plugins[name] = info
        try:
            plugin = ep.load()
        except Exception as exc:
            error = PluginError(f'Error importing plugin "{name}" from {origin}: {exc!r}')
            error.__cause__ = exc
            self._set_broken(info, error)
            return
        try:
            info.unavailable = missing_requirements(name, origin, plugin)
            if info.unavailable is not None:
                log.info("plugin %s (%s) is unavailable: %s", name, origin, info.unavailable)
                return
            self._install(name, plugin, origin)
        except PluginError as exc:
            self._set_broken(info, exc)

    def _set_broken(self, info: PluginInfo, error: PluginError) -> None:
        """Mark ``info`` broken by ``error`` and warn, once per process and error."""
        info.broken, info.error = str(error), error
        key = (info.name, info.origin, info.broken)
        if key not in _WARNED:
            _WARNED.add(key)
            log.warning(
                "%s; the plugin is skipped: jobs that use it fail at submit, everything "
                "else works; fix or uninstall it, or %s", info.broken, block_hint(info.name),
            )

    def _install(self, name: str, plugin: object, origin: str) -> None:
        """Add ``plugin``'s hooks to pluggy; PluginError if they are not sparkjet's hooks."""
        who = plugin_who(name, origin)
        try:
            self.pm.register(plugin, name=name)
        except ValueError as exc:
            raise PluginError(f"cannot register {who}: {exc}") from exc
        except pluggy.PluginValidationError as exc:
            if self.pm.get_plugin(name) is not None:  # pluggy leaves a half-registered plugin
                self.pm.unregister(name=name)
            said = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
            raise PluginError(f"{who} is invalid: {said}") from exc
        own = [
            caller.name for caller in self.pm.get_hookcallers(plugin) or ()
            if not caller.has_spec()
            and any(impl.plugin is plugin and not impl.optionalhook
                    for impl in caller.get_hookimpls())
        ]
        unknown = checks.unknown_hooks(own)
        if unknown is not None:
            self.pm.unregister(name=name)
            raise PluginError(f"{who} {unknown}")

    def register(self, plugin: object, name: str) -> None:
        """Register a plugin object at runtime (scripts, tests, notebooks).

        Unlike an entry point, a plugin registered here that would be broken
        raises :class:`PluginError` at once (its caller is right there), and
        leaves nothing registered; one whose ``sparkjet_requires`` are not
        installed is listed unavailable, as an entry point is.
        """
        if name in self.plugins:
            raise PluginError(f'a plugin named "{name}" is already registered')
        origin = "registered at runtime"
        if name in self.blocked:
            log.debug("plugin %s (%s) is blocked", name, origin)
            return
        module = plugin.__name__ if inspect.ismodule(plugin) else type(plugin).__module__
        info = PluginInfo(name, origin, module=module)
        info.unavailable = missing_requirements(name, origin, plugin)
        if info.unavailable is not None:
            log.info("plugin %s (%s) is unavailable: %s", name, origin, info.unavailable)
            self.plugins[name] = info
            return
        self._install(name, plugin, origin)
        self.plugins[name] = info
        try:
            self._collect(name)
        except PluginError:
            self._forget(name)
            raise

    def _forget(self, name: str, *, keep_info: bool = False) -> None:
        """Undo a registration that failed half-way: nothing of it stays (but its listing)."""
        self.pm.unregister(name=name)
        info = self.plugins.get(name) if keep_info else self.plugins.pop(name, None)
        for entry in info.registered if info is not None else ():
            if self._by_kind.get((entry.category, entry.kind)) is entry:
                del self._by_kind[(entry.category, entry.kind)]
            if self._by_class.get(entry.cls) is entry:
                del self._by_class[entry.cls]
        if info is not None:
            info.registered.clear()

    def _collect(self, name: str) -> None:
        """Call the registration hooks of one plugin and record what it registers."""
        others = [p for p in self.pm.get_plugins() if self.pm.get_name(p) != name]
        who = plugin_who(name, self.plugins[name].origin)
        for registration in REGISTRATIONS:
            hook_name = registration.spec.__name__
            caller = self.pm.subset_hook_caller(hook_name, remove_plugins=others)

            def register(cls: Any, *, _registration: Registration = registration) -> None:
                self._add(name, cls, _registration)

            try:
                caller(register=register)
            except PluginError:
                raise
            except Exception as exc:
                raise PluginError(f"{who} failed in {hook_name}: {exc!r}") from exc

    def _add(self, plugin: str, cls: Any, registration: Registration) -> None:
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
        streaming = category is Category.SOURCE and getattr(cls, "streaming", False) is True
        problems = checks.contract_problems(cls, base, streaming=streaming)
        if problems:
            raise PluginError(f"{where}: {checks.describe_problems(category, cls, problems)}")
        if category is Category.SOURCE:
            check_accepts_start(where, cls)
        existing = self._by_kind.get((category, kind))
        if existing is not None and existing.cls is not cls:
            raise _Conflict(
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
        """The class of ``category`` registered as ``kind``; PluginError naming the known ones.

        When plugins are broken or unavailable, the error names them too: one
        of them may be the plugin that would have registered ``kind``.
        """
        entry = self._by_kind.get((category, kind))
        if entry is None:
            known = sorted(k for (c, k) in self._by_kind if c == category)
            raise PluginError(
                f'no {category} of kind "{kind}" is registered (known: {", ".join(known)}); '
                f"is its plugin installed and not blocked?{self._not_in_use_hint()}"
            )
        return entry

    def participant(self, obj: object, stage: str) -> Registered:
        """The registration a pipeline's source, sink or transform ``obj`` runs under, at submit.

        Refused with a :class:`~sparkjet.errors.PipelineDefinitionError` naming
        ``stage`` when no plugin in use registers its class (naming the
        broken, unavailable or blocked plugin it belongs to, when it belongs
        to one), or when its class or its ``streaming`` declaration breaks
        the contract: a subclass of a registered class, or an instance that
        sets ``streaming`` itself, is checked here as the registered class
        was when it registered.
        """
        cls = type(obj)
        entry = self.lookup_class(cls)
        if entry is None:
            why, cause = self._why_unregistered(cls)
            raise PipelineDefinitionError(
                f"stage '{stage}' uses {cls.__module__}.{cls.__qualname__}, {why}", stage
            ) from cause
        streaming = entry.category is Category.SOURCE and getattr(obj, "streaming", False) is True
        declared = entry.category is Category.SOURCE and getattr(cls, "streaming", False) is True
        if cls is not entry.cls or streaming != declared:
            problems = checks.contract_problems(cls, BASES[entry.category], streaming=streaming)
            if problems:
                raise PipelineDefinitionError(
                    f"stage '{stage}': {checks.describe_problems(entry.category, cls, problems)}",
                    stage,
                )
        return entry

    def _why_unregistered(self, cls: type[Any]) -> tuple[str, BaseException | None]:
        """Why no plugin in use registers ``cls`` (words after "uses <class>, "), and the cause."""
        candidates = [i for i in self.plugins.values() if not i.in_use]
        for info in [*candidates, *self._blocked_found.values()]:
            if not info.owns(cls):
                continue
            who = f'plugin "{info.name}" ({info.origin})'
            if info.broken is not None:
                return (f"whose {who} is broken: {info.broken}; fix or reinstall it "
                        "(then `sparkjet plugins` lists it in use)"), info.error
            if info.unavailable is not None:
                return f"whose {who} is unavailable: {info.unavailable}", None
            return (f"whose {who} is blocked (SPARKJET_BLOCK_PLUGINS or [plugins] disable): "
                    "unblock it to use it"), None
        return (
            "which no loaded plugin registers: install its plugin (entry point group "
            "'sparkjet'), check it is not blocked, or call client.register_plugin(...)"
            + self._not_in_use_hint(), None
        )

    def _not_in_use_hint(self) -> str:
        """``; plugins not in use, which may be the one: ...``, or "" when all are in use."""
        lines = [f'plugin "{i.name}" ({i.origin}) is {i.status()}'
                 for i in self.plugins.values() if not i.in_use]
        if not lines:
            return ""
        return "; plugins not in use, which may be the one: " + "; ".join(lines)

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
