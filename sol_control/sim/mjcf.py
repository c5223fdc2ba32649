"""MJCF (MuJoCo) from the cell description (sim/description.py): one model per station.

The QC line is kinematic in MuJoCo (parts and pusher are mocap bodies moved by sim/conveyor.py), so
none of its geoms takes part in contacts; the pick station is fully dynamic. Colours are written
with 6 decimals, positions and sizes at full precision, so the same description gives the same
compiled model every time.
"""
from __future__ import annotations

from sol_control.sim.description import (Body, Camera, Geom, Lighting, Material, Mesh, Physics, PickStation,
                                         PositionActuator, QCLine)

FLAT = 'specular="0" shininess="0" reflectance="0"'
COLLIDES = {"all": "", "none": 'contype="0" conaffinity="0"', "world": 'contype="2" conaffinity="1"'}
NO_CONTACT = COLLIDES["none"]


def _num(values) -> str:
    return " ".join(f"{v}" for v in values)


def _rgb(values) -> str:
    return " ".join(f"{v:.6f}" for v in values)


def _header(name: str, physics: Physics, light: Lighting) -> str:
    return f"""<mujoco model="{name}">
  <compiler angle="radian"/>
  <option timestep="{physics.timestep_s}" cone="{physics.cone}" impratio="{physics.impratio:g}" \
integrator="{physics.integrator}"/>
  <visual>
    <headlight ambient="{_num(light.ambient)}" diffuse="{_num(light.diffuse)}" specular="{_num(light.specular)}"/>
    <map znear="0.01"/>
    <quality shadowsize="0"/>
    <global offwidth="640" offheight="480"/>
  </visual>"""


def material_xml(m: Material) -> str:
    if m.texture_px is None:
        return f'<material name="{m.name}" rgba="{_rgb(m.rgba)}" {FLAT if m.flat else ""}/>'
    tex = m.name.replace("_mat", "_tex")              # part_mat3 → part_tex3 (sim/conveyor.py finds it by name)
    return (f'<texture name="{tex}" type="2d" builtin="flat" rgb1="{_rgb(m.rgba[:3])}" '
            f'width="{m.texture_px}" height="{m.texture_px}"/>'
            f'<material name="{m.name}" texture="{tex}" texrepeat="1 1" texuniform="false" '
            f'{FLAT if m.flat else ""}/>')


def mesh_xml(m: Mesh) -> str:
    v = " ".join(f"{a:.6f} {b:.6f} {c:.6f}" for a, b, c in m.vertices_m)
    f = " ".join(f"{a} {b} {c}" for a, b, c in m.faces)
    return f'<mesh name="{m.name}" vertex="{v}" face="{f}"/>'


def geom_xml(g: Geom, kinematic: bool = False) -> str:
    attrs = [f'name="{g.name}"' if g.name else "", f'type="{g.kind}"']
    attrs.append(f'fromto="{_num(g.fromto)}"' if g.fromto else "")
    attrs.append(f'size="{_num(g.size)}"' if g.size else "")
    attrs.append(f'mesh="{g.mesh}"' if g.mesh else "")
    attrs.append(f'pos="{_num(g.pos)}"' if any(g.pos) else "")
    attrs.append(f'material="{g.material}"' if g.material else "")
    attrs.append(f'rgba="{_rgb(g.rgba)}"' if g.rgba else "")
    attrs.append(NO_CONTACT if kinematic else COLLIDES[g.collides])
    attrs.append(f'group="{g.group}"' if g.group is not None else "")
    attrs.append(f'density="{g.density}"' if g.density is not None else "")
    if g.contact is not None:
        c = g.contact
        attrs += [f'friction="{_num(c.friction)}"' if c.friction else "",
                  f'condim="{c.condim}"' if c.condim else "", f'solref="{_num(c.solref)}"' if c.solref else ""]
    return "<geom " + " ".join(a for a in attrs if a) + "/>"


def body_xml(b: Body, kinematic: bool = False) -> str:
    attrs = [f'name="{b.name}"', f'pos="{_num(b.pos)}"', f'quat="{_num(b.quat)}"' if b.quat else "",
             'mocap="true"' if b.mocap else "", 'gravcomp="1"' if b.gravcomp else ""]
    inner = []
    if b.free:
        inner.append(f'<freejoint name="{b.name}_free"/>')
    if b.joint is not None:
        j = b.joint
        inner.append(f'<joint name="{j.name}"' + (f' type="{j.kind}"' if j.kind != "hinge" else "")
                     + f' axis="{_num(j.axis)}"' + (f' range="{_num(j.range)}"' if j.range else "")
                     + (f' damping="{j.damping:g}"' if j.damping is not None else "") + "/>")
    inner += [geom_xml(g, kinematic) for g in b.geoms]
    inner += [f'<site name="{s.name}" pos="{_num(s.pos)}" size="{s.size_m}"/>' for s in b.sites]
    inner += [body_xml(c, kinematic) for c in b.children]
    return "<body " + " ".join(a for a in attrs if a) + ">" + "".join(inner) + "</body>"


def camera_xml(c: Camera) -> str:
    orient = f' xyaxes="{_num(c.xyaxes)}"' if c.xyaxes else ""
    proj = ' projection="orthographic"' if c.projection == "orthographic" else ""
    return f'<camera name="{c.name}" pos="{_num(c.pos)}"{orient}{proj} fovy="{c.fovy}"/>'


def actuator_xml(a: PositionActuator) -> str:
    limit = (f' forcelimited="true" forcerange="{-a.force_limit_n:g} {a.force_limit_n:g}"'
             if a.force_limit_n is not None else "")
    return (f'<position name="a_{a.joint}" joint="{a.joint}" kp="{a.kp:g}" kv="{a.kv:g}" '
            f'ctrlrange="{_num(a.ctrl_range)}"{limit}/>')


def qc_line_mjcf(line: QCLine) -> str:
    assets = [material_xml(line.belt_material)] + [material_xml(m) for m in line.part_materials]
    bodies = [line.pusher.body, *line.part_slots]
    return f"""{_header("sol_control_qc_line", line.physics, line.lighting)}
  <asset>
    {"".join(assets)}
  </asset>
  <worldbody>
    {geom_xml(line.belt, kinematic=True)}
    {"".join(geom_xml(g, kinematic=True) for g in line.bins)}
    {camera_xml(line.camera)}
    {camera_xml(line.overview)}
    {"".join(body_xml(b, kinematic=True) for b in bodies)}
  </worldbody>
</mujoco>"""


def pick_station_mjcf(st: PickStation) -> str:
    meshes = [mesh_xml(m) for ob in st.objects for m in ob.meshes]
    excludes = "".join(f'<exclude body1="{a}" body2="{b}"/>' for a, b in st.contact_excludes)
    return f"""{_header("sol_control_pick_station", st.physics, st.lighting)}
  <asset>
    {material_xml(st.table_material)}
    {"".join(meshes)}
  </asset>
  <default><joint damping="{st.joint_damping:g}" armature="{st.joint_armature:g}"/></default>
  <worldbody>
    {geom_xml(st.table)}
    {camera_xml(st.camera)}
    {camera_xml(st.overview)}
    {"".join(body_xml(ob.body) for ob in st.objects)}
    {body_xml(st.arm)}
  </worldbody>
  <contact>{excludes}</contact>
  <actuator>
    {"".join(actuator_xml(a) for a in st.actuators)}
  </actuator>
</mujoco>"""
