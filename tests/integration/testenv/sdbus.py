"""A system bus with systemd's manager on it, as far as kembali asks it.

At SIGTERM under systemd, kembali asks over the system bus which job
systemd runs on its unit (src/sdjob.c): a restart (store the requests in
hand for the next process) or a stop (answer them). ``SystemdBus`` is a
real ``dbus-daemon`` on a private socket, and on it a stand-in for
``org.freedesktop.systemd1`` that answers exactly those questions with
systemd's own names and signatures: ``Manager.GetUnitByPID(u) -> o``, the
unit's ``Job`` property ``(uo)`` (0 and "/" when no job runs) and the job's
``JobType`` property ``s``. kembali reaches it through
``DBUS_SYSTEM_BUS_ADDRESS`` (``env()``). Run as a script, this file is the
stand-in (its own process: dbus-python wants a main loop of its own)."""

import os
import subprocess
import sys

if __package__:  # run as a script, it is the stand-in and needs none of these
    from .asserts import wait_for
    from .procs import socket_path, spawn

__all__ = ["SystemdBus"]

UNIT = "/org/freedesktop/systemd1/unit/kembali_2eservice"
JOB = "/org/freedesktop/systemd1/job/42"

_CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path=%s</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
  </policy>
</busconfig>
"""


class SystemdBus:
    """A private system bus whose systemd says the unit's job is `job`
    ("restart", "stop", ... or None: no job). ``asked()``: the pids
    GetUnitByPID was asked about."""

    def __init__(self, tmpdir, job):
        self.dir = tmpdir
        self.path = socket_path(tmpdir, "system_bus.sock")
        conf = os.path.join(tmpdir, "system-bus.conf")
        with open(conf, "w") as f:
            f.write(_CONFIG % self.path)
        self.log = os.path.join(tmpdir, "fake-systemd.log")
        self.daemon = spawn(["dbus-daemon", "--config-file=" + conf, "--nofork", "--nopidfile"], tmpdir,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: os.path.exists(self.path), 10, msg="dbus-daemon's socket")
        with open(self.log, "ab") as log:
            self.service = spawn(["/usr/bin/python3", os.path.abspath(__file__), self.address(), job or "-"],
                                 tmpdir, stdout=log, stderr=subprocess.STDOUT)
        wait_for(lambda: "ready" in self._lines(), 15, msg="the stand-in for systemd on the bus")

    def address(self):
        return "unix:path=" + self.path

    def env(self):
        return {"DBUS_SYSTEM_BUS_ADDRESS": self.address()}

    def _lines(self):
        with open(self.log) as f:
            return f.read().split("\n")

    def asked(self):
        return [int(l.split()[1]) for l in self._lines() if l.startswith("GetUnitByPID ")]


def _serve(address, job):
    import dbus
    import dbus.mainloop.glib
    import dbus.service
    from gi.repository import GLib

    dbus.mainloop.glib.DBusGMainLoop(set_as_default=True)
    bus = dbus.bus.BusConnection(address)
    props = {
        (UNIT, "org.freedesktop.systemd1.Unit", "Job"):
            dbus.Struct((dbus.UInt32(42 if job != "-" else 0), dbus.ObjectPath(JOB if job != "-" else "/")),
                        signature="uo"),
        (JOB, "org.freedesktop.systemd1.Job", "JobType"): dbus.String(job),
    }

    class Manager(dbus.service.Object):
        @dbus.service.method("org.freedesktop.systemd1.Manager", in_signature="u", out_signature="o")
        def GetUnitByPID(self, pid):
            print("GetUnitByPID %d" % pid, flush=True)
            return dbus.ObjectPath(UNIT)

    class Properties(dbus.service.Object):
        def __init__(self, path):
            super().__init__(bus, path)
            self.at = path

        @dbus.service.method("org.freedesktop.DBus.Properties", in_signature="ss", out_signature="v")
        def Get(self, iface, name):
            key = (self.at, iface, name)
            if key not in props or (self.at == JOB and job == "-"):
                raise dbus.exceptions.DBusException("no such property", name="org.freedesktop.DBus.Error.UnknownProperty")
            return props[key]

    keep = [dbus.service.BusName("org.freedesktop.systemd1", bus), Manager(bus, "/org/freedesktop/systemd1"),
            Properties(UNIT), Properties(JOB)]
    print("ready", flush=True)
    GLib.MainLoop().run()
    return keep


if __name__ == "__main__":
    _serve(sys.argv[1], sys.argv[2])
