#!/usr/bin/env python3
"""`make package-test`: the packaged plugin image, pushed as the docs say, is one Higress takes.

    oci-package-test.py dist/oci TAG dist/ai-load-balancer.wasm

1. Runs `make package` a second time into a temp dir (build not remade): byte-identical layout.
2. Starts Debian's registry server (docker-registry) on 127.0.0.1, a free port, temp storage.
3. Runs the `skopeo copy` line of docs/install-higress.md (the same line as README.md), with
   REGISTRY and TAG set and `--dest-tls-verify=false` added (the test registry is plain HTTP);
   both pages set REGISTRY and TAG before it, TAG to spec.yaml's info.version.
4. GETs the manifest back and checks it against Higress's Wasm plugin image specification
   (https://higress.cn/en/docs/latest/user/wasm-image-spec/, docs/install-higress.md): config
   and layer media types, plugin.tar.gz last, its tarball holding exactly plugin.wasm equal to
   the built wasm, the digest unchanged by the push.
Installs docker-registry and skopeo with apt-get when missing and root, as `make deps` does.
"""

import gzip
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = "plugins/ai-load-balancer"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
# The image specification's layers as `oras push` writes them (it keeps argument order, so
# plugin.tar.gz goes last), and what Higress's fetcher reads (the last layer).
WANT_CONFIG = ("application/vnd.unknown.config.v1+json", b"{}")
WANT_LAYERS = [
    ("README_EN.md", "application/vnd.module.wasm.doc.v1.EN+markdown"),
    ("README.md", "application/vnd.module.wasm.doc.v1+markdown"),
    ("spec.yaml", "application/vnd.module.wasm.spec.v1+yaml"),
    ("plugin.tar.gz", "application/vnd.oci.image.layer.v1.tar+gzip"),
]


def fail(msg):
    print(f"package-test: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def ensure_tools():
    missing = [p for p, b in [("docker-registry", "docker-registry"), ("skopeo", "skopeo")]
               if shutil.which(b) is None]
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        fail(f"{' '.join(missing)} missing; install with: "
             f"sudo apt-get update && sudo apt-get install -y {' '.join(missing)}")
    print(f"package-test: installing {' '.join(missing)} (apt-get)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True, env=env,
                   stdout=subprocess.DEVNULL)


def tree(path):
    """Every file under path, relative name -> bytes."""
    out = {}
    for d, _, files in os.walk(path):
        for f in files:
            full = os.path.join(d, f)
            out[os.path.relpath(full, path)] = open(full, "rb").read()
    return out


def documented_command():
    """The `skopeo copy` line; README.md and docs/install-higress.md must show the same one,
    after lines that set REGISTRY and TAG, the latter to spec.yaml's info.version (the tag
    `make package` gives by default)."""
    spec = open(os.path.join(ROOT, "plugin-config/spec.yaml"), encoding="utf-8").read()
    version = re.findall(r"^  version: *(.*)$", spec, re.M)
    lines = []
    for page in ["docs/install-higress.md", "README.md"]:
        text = open(os.path.join(ROOT, page), encoding="utf-8").read()
        found = re.findall(r"^ *(skopeo copy .*)$", text, re.M)
        if len(found) != 1:
            fail(f"{page}: want one `skopeo copy` line, found {found}")
        before = text[:text.index(found[0])]
        sets = {v: re.findall(rf"^ *({v}=.*)$", before, re.M) for v in ("TAG", "REGISTRY")}
        for var, found_set in sets.items():
            if len(found_set) != 1:
                fail(f"{page}: want one line setting {var} before the push, found {found_set}")
        got = subprocess.run(["sh", "-c", sets["TAG"][0].strip() + '\nprintf %s "$TAG"'],
                             cwd=ROOT, check=True, capture_output=True, text=True).stdout
        if [got] != version:
            fail(f"{page}: its TAG line gives {got!r}, spec.yaml's info.version is {version}")
        lines.append(found[0].strip())
    if lines[0] != lines[1]:
        fail(f"README.md and docs/install-higress.md push differently: {lines}")
    return lines[0]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, accept=None):
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.read(), r.headers


def main(layout, tag, wasm_path):
    layout = os.path.abspath(layout)
    wasm = open(wasm_path, "rb").read()
    ensure_tools()
    tmp = tempfile.mkdtemp(prefix="ailb-package-test-")
    registry = None
    try:
        # 1. A second `make package` (the wasm not rebuilt) writes the same bytes.
        time.sleep(1.1)
        again = os.path.join(tmp, "oci-again")
        subprocess.run(["make", "--no-print-directory", "-s", "-o", "build", "package",
                        f"PACKAGE_OCI={again}", f"PACKAGE_TAG={tag}"],
                       cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        first, second = tree(layout), tree(again)
        if first != second:
            diff = sorted(set(first) ^ set(second)) or [k for k in first if first[k] != second[k]]
            fail(f"two `make package` runs differ: {diff}")
        print(f"package-test: ok  reproducible layout ({len(first)} files, byte-identical)")

        # 1b. README_BASE moves the console's README links, and only them.
        moved = os.path.join(tmp, "oci-moved")
        base_url = "https://docs.example.org/ailb/plugin-config"
        subprocess.run(["make", "--no-print-directory", "-s", "-o", "build", "package",
                        f"PACKAGE_OCI={moved}", f"PACKAGE_TAG={tag}",
                        f"README_BASE={base_url}/"],
                       cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        spec_src = open(os.path.join(ROOT, "plugin-config/spec.yaml")).read().split("\n")
        specs = [v.decode() for v in tree(moved).values() if v.startswith(b"# ")
                 and b"readmeUrl" in v]
        if len(specs) != 1:
            fail(f"README_BASE: {len(specs)} spec.yaml layers")
        changed = [(a, b) for a, b in zip(spec_src, specs[0].split("\n")) if a != b]
        want = [f"readmeUrl: {base_url}/README.md", f"en-US: {base_url}/README_EN.md"]
        if [b.strip() for _, b in changed] != want:
            fail(f"README_BASE changed {changed}, want only {want}")
        print(f"package-test: ok  README_BASE moves the two README links to {base_url}")

        # 2. The registry, loopback only.
        port = free_port()
        config = os.path.join(tmp, "registry.yml")
        with open(config, "w") as f:
            f.write(f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n"
                    f"    rootdirectory: {tmp}/storage\nhttp:\n  addr: 127.0.0.1:{port}\n")
        log = open(os.path.join(tmp, "registry.log"), "w")
        registry = subprocess.Popen(["docker-registry", "serve", config],
                                    stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                get(base + "/v2/")
                break
            except OSError:
                if registry.poll() is not None:
                    fail("registry exited: " + open(log.name).read())
                time.sleep(0.1)
        else:
            fail("registry did not answer on " + base)

        # 3. The documented push.
        cmd = documented_command()
        run = cmd.replace("skopeo copy ", "skopeo copy --dest-tls-verify=false ", 1)
        env = dict(os.environ, REGISTRY=f"127.0.0.1:{port}/plugins", TAG=tag)
        subprocess.run(["sh", "-c", run], cwd=os.path.dirname(os.path.dirname(layout)),
                       env=env, check=True, stdout=subprocess.DEVNULL)
        print(f"package-test: ok  pushed with: {cmd}")

        # 4. The manifest as Higress's fetcher reads it.
        body, headers = get(f"{base}/v2/{REPO}/manifests/{tag}", MANIFEST)
        manifest = json.loads(body)
        index = json.loads(first["index.json"])
        if headers.get("Docker-Content-Digest") != index["manifests"][0]["digest"]:
            fail(f"digest changed by the push: {headers.get('Docker-Content-Digest')}")
        if manifest.get("mediaType") != MANIFEST or manifest.get("schemaVersion") != 2:
            fail(f"not an OCI image manifest: {manifest.get('mediaType')}")
        cfg = manifest["config"]
        cfg_body, _ = get(f"{base}/v2/{REPO}/blobs/{cfg['digest']}")
        if (cfg["mediaType"], cfg_body) != WANT_CONFIG:
            fail(f"config {cfg['mediaType']} {cfg_body!r}, want {WANT_CONFIG}")
        got = [(l.get("annotations", {}).get("org.opencontainers.image.title"), l["mediaType"])
               for l in manifest["layers"]]
        if got != WANT_LAYERS:
            fail(f"layers {got}, want {WANT_LAYERS}")
        print("package-test: ok  layers " + ", ".join(f"{n} ({m})" for n, m in got))
        last, _ = get(f"{base}/v2/{REPO}/blobs/{manifest['layers'][-1]['digest']}")
        with tarfile.open(fileobj=io.BytesIO(gzip.decompress(last))) as tar:
            members = tar.getmembers()
            names = [m.name for m in members]
            if names != ["plugin.wasm"] or not members[0].isfile():
                fail(f"last layer holds {names}, want only the file plugin.wasm")
            if tar.extractfile(members[0]).read() != wasm:
                fail(f"plugin.wasm in the last layer differs from {wasm_path}")
        print(f"package-test: ok  last layer plugin.tar.gz holds exactly plugin.wasm = {wasm_path}")
        for (name, _), layer in zip(WANT_LAYERS[:3], manifest["layers"]):
            blob, _ = get(f"{base}/v2/{REPO}/blobs/{layer['digest']}")
            src = {"spec.yaml": "plugin-config/spec.yaml", "README.md": "plugin-config/README.md",
                   "README_EN.md": "plugin-config/README_EN.md"}[name]
            if blob != open(os.path.join(ROOT, src), "rb").read():
                fail(f"layer {name} is not {src}")
        print(f"package-test: ok  manifest {headers.get('Docker-Content-Digest')}")
    finally:
        if registry is not None:
            registry.terminate()
            registry.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__.split("\n\n")[1])
    main(*sys.argv[1:])
