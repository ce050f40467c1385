"""What the vagrant tests share: where vagrant/ is, its Vagrantfile evaluated
against a recording stand-in for Vagrant's config DSL, and a parser of the flags it records."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from repo import REPO

VAGRANT = REPO / "vagrant"


IS_ROOT = os.geteuid() == 0


needs_ruby = pytest.mark.skipif(shutil.which("ruby") is None,
                                reason="ruby is not installed (apt-get install ruby)")


def record_vagrantfile(env: dict | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SWML_")}
    return subprocess.run(["ruby", "-e", RECORDER_RB, str(VAGRANT / "Vagrantfile")],
                          env={**clean, **(env or {})}, capture_output=True, text=True, timeout=60)


def flags(args: list[str]) -> dict[str, str]:
    """provision.sh's arguments: every option takes one value."""
    assert len(args) % 2 == 0 and all(a.startswith("--") for a in args[::2]), args
    d = dict(zip(args[::2], args[1::2]))
    assert len(d) == len(args) // 2, f"an option given twice: {args}"
    return d


# --------------------------------------------------------------------------
# The plan the Vagrantfile hands the VMs
# --------------------------------------------------------------------------
# A stand-in for Vagrant: Vagrant.configure yields a recorder, which logs every
# assignment and call (with its block's calls nested), and the log is printed as JSON.
RECORDER_RB = r'''
require "json"

class Recorder < BasicObject
  def initialize(log, path)
    @log = log
    @path = path
  end

  def method_missing(name, *args, **kw, &blk)
    n = name.to_s
    if n.end_with?("=")
      @log << { "path" => @path + [n.chomp("=")], "set" => args[0] }
      return args[0]
    end
    return ::Recorder.new(@log, @path + [n]) if args.empty? && kw.empty? && blk.nil?
    entry = { "path" => @path + [n], "args" => args, "kw" => kw }
    @log << entry
    if blk
      entry["block"] = []
      subs = (0...[blk.arity, 1].max).map { |i| ::Recorder.new(entry["block"], i.zero? ? [] : ["override"]) }
      blk.call(*subs)
    end
    nil
  end

  def respond_to_missing?(*)
    true
  end
end

module Vagrant
  LOG = []
  def self.configure(version)
    LOG << { "path" => ["configure"], "args" => [version] }
    yield ::Recorder.new(LOG, [])
  end

  def self.require_version(*) end
end

load ARGV.fetch(0)
puts JSON.generate(Vagrant::LOG)
'''


# --------------------------------------------------------------------------
# From the plan to the command lines: provision.sh's files
# --------------------------------------------------------------------------
def make_netns(name: str, ip: str, prefix: int, iface: str) -> None:
    subprocess.run(["ip", "netns", "add", name], check=True)
    ns = ["ip", "-n", name]
    subprocess.run([*ns, "link", "add", iface, "type", "veth", "peer", "name", iface + "p"], check=True)
    subprocess.run([*ns, "addr", "add", f"{ip}/{prefix}", "dev", iface], check=True)
    for dev in (iface, iface + "p"):
        subprocess.run([*ns, "link", "set", dev, "up"], check=True)


needs_plan = needs_ruby
