"""The tabletop scene of the manipulation tasks, composed in code around the Panda shipped in ``envpool_assets``.

Source of the robot: ``envpool_assets/mujoco/robotics/assets/kitchen_franka/franka_assets/`` (``assets.xml`` meshes
and defaults, ``chain.xml`` kinematic chain; the gymnasium-robotics kitchen Franka, modified from
vikashplus/franka, Apache-2.0). The files are found through ``importlib.resources`` and read in place: nothing is
copied into this repository and nothing is downloaded. Their ``actuator.xml`` is not used; the actuators are
defined here (below).

Conventions (all lengths in m, angles in rad, frames right-handed):

- World frame = robot base frame: the Panda's base (``panda0_link0``) at the origin, +x forward over the
  table, +z up. The table top is the plane z = 0 (``TABLE_Z``); the robot stands on it.
- Joint angles are Franka's own convention (Franka Control Interface DH parameters, ``RobotSpec`` limits and
  ``franka_droid().home``): the kitchen model's link6 / link7 frames are turned by pi/2 / pi/4 about their joint
  axes relative to the DH frames, so joints 6 and 7 get ``ref = pi/2`` and ``ref = pi/4`` (MuJoCo's joint
  reference angle) and ``qpos`` reads Franka's angles directly. The model's rounded ``euler='1.57 ...'`` /
  ``'0.7854'`` link frames are replaced by exact pi/2, pi/4 first, so the forward kinematics match the DH model to
  the 0.4 mm the TCP site sits short of Franka's 0.1034 m flange-to-TCP offset (checked in the tests).
- The end effector (EE) is the model's ``end_effector`` site: 0.210 m from link7 along the flange axis, between
  the fingertips, with the orientation of Franka's TCP frame (z out of the gripper, y along the finger motion).
  At the DROID home pose it is at about (0.36, 0, 0.387) pointing straight down.
- Joint limits: the spec's position limits (Franka's published ones), with the model's stops 5 mrad inside them
  and stiffened (MuJoCo's limits are soft: contact can push a joint slightly into its stop). The arm is driven
  by position actuators with gains set here, torques limited to the spec's effort limits, and gravity
  compensated (``gravcomp = 1`` on every robot body, as the Franka controller does). The fingers are the model's two
  slide joints (0 closed, 0.04 m each open), each with a position actuator from one shared command.
- Cameras, DROID names: ``exterior_image_1_left`` and ``exterior_image_2_left`` (left and right of the
  workspace, looking across the table at the robot and the objects), ``wrist_image_left`` (on the hand,
  looking along the gripper). MuJoCo cameras look along their -z axis with +y up.

Task objects are added per task (``build_scene``): a 5 cm cube (free joint), a visual-only target marker (a mocap
body, so every env sets its own pose in ``MjData``), and a cabinet with a drawer on a slide joint (the cabinet is a
mocap body too, so its pose is per env without a model copy).
"""

from __future__ import annotations

import importlib.resources
import math
from functools import cache
from pathlib import Path

import numpy as np

from ctrl_rl.envs.mujoco_bindings import import_mujoco
from ctrl_rl.errors import UserInputError
from ctrl_rl.robots.spec import RobotSpec

CAMERAS = ("exterior_image_1_left", "exterior_image_2_left", "wrist_image_left")
TABLE_Z = 0.0  # table top height (world z)
CUBE_HALF = 0.025  # cube half size (m)
DRAWER_TRAVEL = 0.20  # how far the drawer slides out (m)
JOINT_NAMES = tuple(f"robot:panda0_joint{i}" for i in range(1, 8))
FINGER_NAMES = ("robot:panda0_finger_joint1", "robot:panda0_finger_joint2")
FINGER_OPEN = 0.04  # finger slide position when fully open (m, each finger)
JOINT_REF = (0.0, 0.0, 0.0, 0.0, 0.0, math.pi / 2, math.pi / 4)  # see the module docstring
# Arm servo: position gains (N m / rad), critically damped by the actuator (``dampratio = 1`` at the home pose), a
# little passive joint damping (N m s / rad; the model's classes had 100 / 10, which at Franka's joint speeds of
# ~2 rad/s would eat the whole torque budget); torques limited to the spec's effort limits.
ARM_KP = (4000.0, 4000.0, 3000.0, 3000.0, 800.0, 800.0, 400.0)
ARM_DAMPING = (2.0, 2.0, 2.0, 2.0, 0.5, 0.5, 0.5)
LIMIT_INSET = 0.005  # rad between the model's joint stops and the spec's position limits
FINGER_KP = 500.0  # the model's finger gain; force limit 70 N
SUBSTEPS = 33  # physics steps per 1/15 s control step
PHYSICS_DT = 1.0 / (15.0 * SUBSTEPS)  # s per physics step: ~2.02 ms, so 33 of them make exactly 1/15 s

_RENAMES = (  # exact link frames (see the module docstring): (text in chain.xml, replacement)
    ("euler='1.57 0 1.57'", f"euler='{math.pi / 2!r} 0 {math.pi / 2!r}'"),
    ("euler='1.57 0 0.7854'", f"euler='{math.pi / 2!r} 0 {math.pi / 4!r}'"),
)


def franka_assets_dir() -> Path:
    """The installed ``franka_assets`` folder of ``envpool_assets`` (never copied, never downloaded)."""
    try:
        root = importlib.resources.files("envpool_assets")
    except ModuleNotFoundError:
        raise UserInputError("the manip: tasks need the envpool_assets package for the Panda model: expected it "
                             "installed (pip install envpool-assets).") from None
    path = Path(str(root)) / "mujoco" / "robotics" / "assets" / "kitchen_franka" / "franka_assets"
    if not (path / "chain.xml").is_file():
        raise UserInputError(f"the Panda model is missing from {path}: expected envpool_assets with "
                             "mujoco/robotics/assets/kitchen_franka/franka_assets/chain.xml.")
    return path


def look_at(pos, target, up=(0.0, 0.0, 1.0)) -> np.ndarray:
    """Quaternion (w, x, y, z) of a MuJoCo camera at ``pos`` looking at ``target`` (camera -z forward, +y up)."""
    pos, target, up = (np.asarray(v, dtype=np.float64) for v in (pos, target, up))
    back = pos - target
    back /= np.linalg.norm(back)  # camera +z points away from the target
    right = np.cross(up, back)
    right /= np.linalg.norm(right)
    cam_up = np.cross(back, right)
    return mat_to_quat(np.stack([right, cam_up, back], axis=1))


def mat_to_quat(r: np.ndarray) -> np.ndarray:
    """Unit quaternion (w, x, y, z), w >= 0, of a 3x3 rotation matrix."""
    mujoco = import_mujoco()

    q = np.empty(4)
    mujoco.mju_mat2Quat(q, np.ascontiguousarray(r, dtype=np.float64).ravel())
    return q if q[0] >= 0 else -q


# Nominal camera placements: (pos, look-at target) in the world frame; fovy in degrees. DROID's two exterior
# ZED 2 cameras stand left and right of the robot looking at the workspace; its wrist ZED Mini is on the hand.
EXTERIOR_CAMERAS = {
    "exterior_image_1_left": ((0.70, 0.80, 0.70), (0.42, 0.0, 0.16)),
    "exterior_image_2_left": ((0.70, -0.80, 0.70), (0.42, 0.0, 0.16)),
}
EXTERIOR_FOVY = 55.0
WRIST_FOVY = 75.0


def _robot_xml(assets: Path) -> tuple[str, str]:
    """(asset/default block, worldbody chain) of the Panda, with the exact link frames."""
    chain = (assets / "chain.xml").read_text()
    for old, new in _RENAMES:
        if old not in chain:
            raise UserInputError(f"{assets / 'chain.xml'} does not contain {old!r}: expected the kitchen Franka "
                                 "model of envpool_assets 0.4 (a different version of the asset?).")
        chain = chain.replace(old, new)
    body = chain[chain.index("<mujocoinclude>") + len("<mujocoinclude>"): chain.rindex("</mujocoinclude>")]
    return f'<include file="{assets / "assets.xml"}"/>\n<compiler meshdir="{assets / "meshes"}"/>', body


def _wrist_camera_xml() -> str:
    # In link7's frame the flange axis is +z and the hand sits at z = 0.107, turned -45 deg about z; the camera sits
    # 0.09 m off the axis along the hand's x (across the finger motion) and looks along +z, tilted toward the axis.
    c, s = math.cos(-math.pi / 4), math.sin(-math.pi / 4)
    off = 0.09
    pos = (off * c, off * s, 0.10)
    target = (0.0, 0.0, 0.30)  # a point on the gripper axis beyond the fingertips
    fwd = np.subtract(target, pos)
    quat = look_at(pos, target, up=(c, s, 0.0) if abs(fwd[2]) < 0.99 else (1.0, 0.0, 0.0))
    return (f'<camera name="wrist_image_left" pos="{pos[0]:.5f} {pos[1]:.5f} {pos[2]:.5f}" '
            f'quat="{quat[0]:.6f} {quat[1]:.6f} {quat[2]:.6f} {quat[3]:.6f}" fovy="{WRIST_FOVY}"/>')


def _task_xml(task: str) -> str:
    """Worldbody XML of the task's objects."""
    parts = []
    if task in ("Lift", "Push", "PickPlace"):
        h = CUBE_HALF
        parts.append(f"""
    <body name="cube" pos="0.5 0 {TABLE_Z + h}">
      <freejoint name="cube"/>
      <geom name="cube" type="box" size="{h} {h} {h}" mass="0.05" rgba="0.85 0.15 0.12 1" friction="1 0.005 0.0001"
            condim="4" priority="1"/>
    </body>""")
    if task == "Push":
        parts.append(f"""
    <body name="target" mocap="true" pos="0.6 0 {TABLE_Z}">
      <geom name="target" type="cylinder" size="0.04 0.001" rgba="0.1 0.8 0.2 0.6" contype="0" conaffinity="0"/>
    </body>""")
    elif task in ("Reach", "PickPlace"):
        parts.append("""
    <body name="target" mocap="true" pos="0.5 0 0.2">
      <geom name="target" type="sphere" size="0.02" rgba="0.1 0.8 0.2 0.6" contype="0" conaffinity="0"/>
    </body>""")
    if task == "OpenDrawer":
        # Cabinet open toward the robot (-x): walls 2 cm, outer box 0.30 x 0.32 x 0.16; the drawer slides along -x.
        # The handle (a bar along y, 7.5 cm in front of the drawer) sits near the top of the drawer front, so a
        # gripper pointing down and holding it keeps its palm (3.7 cm above the fingertip site) above the cabinet.
        w, d, hgt, t = 0.16, 0.15, 0.07, 0.01  # half width (y), half depth (x), half height (z), wall half thickness
        hz, so = 2 * hgt - 0.03, 0.075  # handle height in the drawer frame, handle standoff
        parts.append(f"""
    <body name="cabinet" mocap="true" pos="0.75 0 {TABLE_Z}">
      <geom name="cab_top" type="box" size="{d} {w} {t}" pos="0 0 {2 * hgt + t}" material="cabinet"/>
      <geom name="cab_bottom" type="box" size="{d} {w} {t}" pos="0 0 {t}" material="cabinet"/>
      <geom name="cab_left" type="box" size="{d} {t} {hgt}" pos="0 {w - t} {hgt + t}" material="cabinet"/>
      <geom name="cab_right" type="box" size="{d} {t} {hgt}" pos="0 {-w + t} {hgt + t}" material="cabinet"/>
      <geom name="cab_back" type="box" size="{t} {w} {hgt}" pos="{d - t} 0 {hgt + t}" material="cabinet"/>
      <body name="drawer" pos="0 0 {2 * t + 0.002}">
        <joint name="drawer" type="slide" axis="-1 0 0" range="0 {DRAWER_TRAVEL}" damping="5" frictionloss="0.5"
               armature="0.05"/>
        <geom name="drawer_front" type="box" size="{t} {w - 2 * t - 0.003} {hgt - 0.012}" pos="{-d + t} 0 {hgt - 0.01}"
              material="drawer" mass="0.3"/>
        <geom name="drawer_bottom" type="box" size="{d - 2 * t} {w - 2 * t - 0.003} {t / 2}" pos="0 0 {t / 2}"
              material="drawer" mass="0.3"/>
        <geom name="drawer_back" type="box" size="{t / 2} {w - 2 * t - 0.003} {hgt / 2}" pos="{d - 3 * t} 0 {hgt / 2}"
              material="drawer" mass="0.1"/>
        <geom name="handle" type="capsule" fromto="{-d - so} -0.05 {hz} {-d - so} 0.05 {hz}" size="0.008"
              rgba="0.75 0.75 0.78 1" mass="0.05" friction="1.5 0.005 0.0001"/>
        <geom name="handle_l" type="capsule" fromto="{-d} -0.05 {hz} {-d - so} -0.05 {hz}" size="0.006"
              rgba="0.75 0.75 0.78 1" mass="0.01"/>
        <geom name="handle_r" type="capsule" fromto="{-d} 0.05 {hz} {-d - so} 0.05 {hz}" size="0.006"
              rgba="0.75 0.75 0.78 1" mass="0.01"/>
        <site name="handle" pos="{-d - so} 0 {hz}" size="0.005" rgba="0 0 0 0"/>
      </body>
    </body>""")
    return "".join(parts)


def scene_xml(task: str) -> str:
    """The MJCF text of the task's scene (robot, table, lights, cameras, task objects)."""
    assets = franka_assets_dir()
    robot_assets, chain = _robot_xml(assets)
    chain = chain.replace('<site name=\'end_effector\'', _wrist_camera_xml() + "\n<site name='end_effector'", 1)
    cams = "\n".join(
        '    <camera name="{}" pos="{:.4f} {:.4f} {:.4f}" quat="{:.6f} {:.6f} {:.6f} {:.6f}" fovy="{}"/>'.format(
            name, *pos, *look_at(pos, target), EXTERIOR_FOVY)
        for name, (pos, target) in EXTERIOR_CAMERAS.items())
    return f"""<mujoco model="ctrl_rl_manip_{task.lower()}">
  {robot_assets}
  <option timestep="{PHYSICS_DT}" integrator="implicitfast" cone="elliptic" impratio="5"/>
  <visual>
    <global offwidth="1280" offheight="720"/>
    <quality shadowsize="0"/>
    <headlight ambient="0.35 0.35 0.35" diffuse="0.35 0.35 0.35" specular="0.05 0.05 0.05"/>
  </visual>
  <asset>
    <texture name="floor" type="2d" builtin="checker" rgb1="0.32 0.34 0.38" rgb2="0.26 0.28 0.31" width="128"
             height="128"/>
    <texture name="sky" type="skybox" builtin="gradient" rgb1="0.55 0.62 0.70" rgb2="0.20 0.22 0.26" width="64"
             height="64"/>
    <material name="floor" texture="floor" texrepeat="6 6" reflectance="0"/>
    <material name="table" rgba="0.62 0.50 0.36 1" reflectance="0"/>
    <material name="cabinet" rgba="0.85 0.85 0.82 1" reflectance="0"/>
    <material name="drawer" rgba="0.35 0.45 0.60 1" reflectance="0"/>
  </asset>
  <worldbody>
    <light name="top" pos="0.4 0 1.6" dir="0 0 -1" directional="true" diffuse="0.55 0.55 0.55" castshadow="false"/>
    <light name="side" pos="0.9 0.8 1.0" dir="-0.4 -0.6 -0.7" directional="false" diffuse="0.3 0.3 0.3"
           castshadow="false"/>
    <geom name="floor" type="plane" size="3 3 0.1" pos="0 0 -0.75" material="floor"/>
    <geom name="table" type="box" size="0.6 0.75 0.02" pos="0.35 0 {TABLE_Z - 0.02}" material="table"
          friction="1 0.005 0.0001"/>
{cams}
    {chain}
    {_task_xml(task)}
  </worldbody>
</mujoco>"""


@cache
def build_model(task: str, robot: RobotSpec):
    """The compiled ``mujoco.MjModel`` of ``task``'s scene with ``robot``'s limits, cached per (task, robot): shared,
    so copy it before changing it (domain randomisation does)."""
    mujoco = import_mujoco()

    spec = mujoco.MjSpec.from_string(scene_xml(task))
    for i, name in enumerate(JOINT_NAMES):
        j = spec.joint(name)
        j.ref = JOINT_REF[i]
        # the model's stops sit LIMIT_INSET inside the spec's limits: MuJoCo's limits are soft, and a finger pressed
        # on the table can push a joint ~1e-3 rad into its stop, which must still be inside the robot's range
        j.range = [robot.joint_pos_low[i] + LIMIT_INSET, robot.joint_pos_high[i] - LIMIT_INSET]
        j.damping = [ARM_DAMPING[i], 0.0, 0.0]  # MuJoCo 4: (linear, quadratic, cubic) damping
        j.armature = 0.1 if i < 4 else 0.02  # reflected rotor inertia (kg m^2); also steadies the stiff servo
        j.solref_limit = [2.5 * PHYSICS_DT, 1.0]  # stiff stops (MuJoCo's default 0.02 s lets contacts push past them)
        j.solimp_limit = [0.95, 0.99, 0.001, 0.5, 2.0]
        a = spec.add_actuator(name=f"arm{i + 1}", target=name, trntype=mujoco.mjtTrn.mjTRN_JOINT)
        a.set_to_position(kp=ARM_KP[i], dampratio=1.0)
        a.ctrlrange = [robot.joint_pos_low[i], robot.joint_pos_high[i]]
        a.ctrllimited = mujoco.mjtLimited.mjLIMITED_TRUE
        a.forcerange = [-robot.joint_effort_limit[i], robot.joint_effort_limit[i]]
        a.forcelimited = mujoco.mjtLimited.mjLIMITED_TRUE
    for k, name in enumerate(FINGER_NAMES):
        a = spec.add_actuator(name=f"finger{k + 1}", target=name, trntype=mujoco.mjtTrn.mjTRN_JOINT)
        a.set_to_position(kp=FINGER_KP)
        a.ctrlrange = [0.0, FINGER_OPEN]
        a.ctrllimited = mujoco.mjtLimited.mjLIMITED_TRUE
        a.forcerange = [-70.0, 70.0]
        a.forcelimited = mujoco.mjtLimited.mjLIMITED_TRUE
    for body in spec.bodies:
        if body.name.startswith("panda0_"):
            body.gravcomp = 1.0
    return spec.compile()

