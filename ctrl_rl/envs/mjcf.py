"""What a robot spec needs from a MuJoCo model file, read as XML without building a simulator.

``read_mjcf(path)`` follows ``<include file>`` (relative to the main file's folder, as MuJoCo resolves them) and
returns the model's joints (in MuJoCo's order: bodies depth-first in document order, joints in a body in order,
each with its ``qpos`` address), its position actuators (in order, the ``ctrl`` order) and its keyframes. Attribute
values follow MJCF's default classes: ``<default>`` is class ``main``, a nested ``<default class>`` inherits from its
parent, an element takes its own ``class``, else the nearest enclosing body's ``childclass``, else ``main``.

Covered (what MuJoCo Playground's robot files use): ``<compiler angle>`` (MJCF's default is degrees: hinge ranges
are converted to radians; keyframes are always radians), joint ``type`` / ``range`` / ``limited`` (with
``autolimits``), ``<freejoint>``, and ``<position>`` actuators on a joint with ``kp``, ``forcerange``, ``ctrlrange``
(as written: MuJoCo does not convert it from degrees) and ``inheritrange`` (the joint's range, in radians, scaled
about its middle). Refused in one sentence: another actuator type (it would shift the ``ctrl`` order), and
``<replicate>``, ``<frame>``, ``<attach>``, ``<composite>`` and ``<flexcomp>`` in the world body (they would shift
joint addresses). Checked against ``mujoco.MjModel`` in tests/envs/test_playground_robots.py.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from xml.etree import ElementTree

from ctrl_rl.errors import UserInputError

_QPOS_SIZE = {"free": 7, "ball": 4, "hinge": 1, "slide": 1}
_UNSUPPORTED = ("replicate", "frame", "attach", "composite", "flexcomp")


@dataclass(frozen=True)
class Joint:
    name: str
    type: str
    qpos_adr: int
    range: tuple[float, float] | None
    """Radians (hinge) or metres (slide); None when the joint is not limited."""


@dataclass(frozen=True)
class PositionActuator:
    name: str
    joint: str
    kp: float
    ctrlrange: tuple[float, float] | None
    forcerange: tuple[float, float] | None


@dataclass(frozen=True)
class Mjcf:
    joints: tuple[Joint, ...]
    actuators: tuple[PositionActuator, ...]
    keyframes: dict[str, tuple[float, ...]]
    """Keyframe name -> its ``qpos``."""

    def joint(self, name: str) -> Joint:
        for j in self.joints:
            if j.name == name:
                return j
        raise KeyError(name)


def _load(path: str, root_dir: str) -> ElementTree.Element:
    """The file's root with every ``<include>`` replaced by the included file's children, recursively."""
    root = ElementTree.parse(path).getroot()
    _expand(root, path, root_dir)
    return root


def _expand(el: ElementTree.Element, path: str, root_dir: str) -> None:
    children: list[ElementTree.Element] = []
    for child in list(el):
        if child.tag == "include":
            name = child.get("file", "")
            sub = os.path.join(root_dir, name)
            if not os.path.exists(sub):  # older MuJoCo: relative to the including file
                sub = os.path.join(os.path.dirname(path), name)
            children.extend(list(_load(sub, root_dir)))
        else:
            _expand(child, path, root_dir)
            children.append(child)
    el[:] = children


def _compiler(root: ElementTree.Element, key: str, default: str) -> str:
    """A ``<compiler>`` setting: the last one given, else MJCF's default."""
    values = [v for c in root.iter("compiler") if (v := c.get(key)) is not None]
    return values[-1] if values else default


def _floats(text: str | None) -> tuple[float, ...] | None:
    return None if text is None else tuple(float(x) for x in text.split())


def read_mjcf(path: str) -> Mjcf:
    """The joints, position actuators and keyframes of the MJCF model at ``path`` (module docstring)."""
    if not os.path.exists(path):
        raise UserInputError(f"MuJoCo model file {path!r} does not exist: expected the task's assets installed")
    root = _load(path, os.path.dirname(path))
    for tag in _UNSUPPORTED:
        if root.find(f".//worldbody//{tag}") is not None:
            raise UserInputError(f"{path} uses <{tag}>, which this reader does not expand: expected plain bodies")
    degrees = _compiler(root, "angle", "degree") == "degree"
    autolimits = _compiler(root, "autolimits", "true") == "true"

    # default classes: class -> (parent class, {tag: attributes})
    classes: dict[str, tuple[str | None, dict[str, dict[str, str]]]] = {}

    def read_defaults(el: ElementTree.Element, parent: str | None) -> None:
        name = el.get("class", "main")
        classes[name] = (parent, {c.tag: dict(c.attrib) for c in el if c.tag != "default"})
        for c in el:
            if c.tag == "default":
                read_defaults(c, name)

    for d in root.findall("default"):
        read_defaults(d, None)

    def attrs(el: ElementTree.Element, tag: str, cls: str) -> dict[str, str]:
        chain, c = [], cls if cls in classes else "main"
        while c is not None and c in classes:
            chain.append(c)
            c = classes[c][0]
        out: dict[str, str] = {}
        for c in reversed(chain):
            out.update(classes[c][1].get(tag, {}))
        out.update(el.attrib)
        return out

    joints: list[Joint] = []
    adr = 0

    def walk(body: ElementTree.Element, childclass: str) -> None:
        nonlocal adr
        cls = body.get("childclass", childclass)
        for el in body:
            if el.tag == "freejoint":
                joints.append(Joint(el.get("name", ""), "free", adr, None))
                adr += 7
            elif el.tag == "joint":
                a = attrs(el, "joint", el.get("class", cls))
                kind = a.get("type", "hinge")
                rng = _floats(a.get("range"))
                limited = a.get("limited", "auto")
                on = kind in ("hinge", "slide") and (limited == "true" or (limited == "auto" and autolimits
                                                                            and rng is not None))
                if on and rng is not None and kind == "hinge" and degrees:
                    rng = tuple(math.radians(x) for x in rng)
                joints.append(Joint(a.get("name", ""), kind, adr, (rng[0], rng[1]) if on and rng else None))
                adr += _QPOS_SIZE[kind]
        for el in body:
            if el.tag == "body":
                walk(el, cls)

    for wb in root.findall("worldbody"):
        walk(wb, "main")

    by_name = {j.name: j for j in joints}
    actuators = []
    for section in root.findall("actuator"):
        for el in section:
            if el.tag != "position" or "joint" not in el.attrib:
                # another actuator would take a ctrl index this reader does not account for
                raise UserInputError(f"{path}: actuator <{el.tag} name={el.get('name')!r}> is not a position "
                                     "actuator on a joint: expected only those")
            a = attrs(el, "position", el.get("class", "main"))
            joint = by_name.get(a["joint"])
            if joint is None:
                raise UserInputError(f"{path}: actuator {a.get('name')!r} drives joint {a['joint']!r}, which the "
                                     "model does not have: expected a joint of the model")
            ctrl = _floats(a.get("ctrlrange"))
            inherit = float(a.get("inheritrange", 0))
            if inherit == 1 and joint.range is not None:
                ctrl = joint.range
            elif inherit > 0 and joint.range is not None:
                mid, half = (joint.range[0] + joint.range[1]) / 2, (joint.range[1] - joint.range[0]) / 2
                ctrl = (mid - inherit * half, mid + inherit * half)
            force = _floats(a.get("forcerange"))
            actuators.append(PositionActuator(a.get("name", ""), joint.name, float(a.get("kp", 1.0)),
                                              (ctrl[0], ctrl[1]) if ctrl else None,
                                              (force[0], force[1]) if force else None))
    keyframes = {}
    for section in root.findall("keyframe"):
        for k in section.findall("key"):
            qpos = _floats(k.get("qpos"))
            if qpos is not None:
                keyframes[k.get("name", "")] = qpos
    return Mjcf(tuple(joints), tuple(actuators), keyframes)
