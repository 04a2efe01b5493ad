#!/usr/bin/env python3
"""Writes the Higress plugin image as an OCI image layout (`make package`).

    oci-package.py [--readme-base URL] OUT_DIR TAG plugin.wasm spec.yaml README.md README_EN.md

With --readme-base, spec.yaml's `readmeUrl` and `x-readmeUrl-i18n.en-US` (links the console
opens) become URL/README.md and URL/README_EN.md: where the publisher serves plugin-config/.

OUT_DIR gets `oci-layout`, `index.json` (TAG as `org.opencontainers.image.ref.name`) and
`blobs/sha256/...`. The manifest follows Higress's Wasm plugin image specification
(https://higress.cn/en/docs/latest/user/wasm-image-spec/) as `oras push` (1.0) writes it: config
`application/vnd.unknown.config.v1+json` holding `{}`, then README_EN.md, README.md, spec.yaml
and LAST `plugin.tar.gz` holding only `plugin.wasm`: Higress's image fetcher reads the Wasm
from the last layer of an OCI image. Copy the layout unchanged (docs/install-higress.md, which
also says how Higress's own CI publishes today):

    skopeo copy --preserve-digests oci:dist/oci:TAG docker://REGISTRY/ai-load-balancer:TAG

Reproducible: the same inputs give the same bytes (tar entry with mtime 0, owner 0:0, mode
0644; gzip without name or time; JSON with sorted keys; no creation-time annotation).
python3 standard library only.
"""

import gzip
import hashlib
import io
import json
import os
import shutil
import sys
import tarfile

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.unknown.config.v1+json"
TITLE = "org.opencontainers.image.title"
# Layer order and media types of the image specification; plugin.tar.gz must stay last.
LAYERS = [
    ("README_EN.md", "application/vnd.module.wasm.doc.v1.EN+markdown"),
    ("README.md", "application/vnd.module.wasm.doc.v1+markdown"),
    ("spec.yaml", "application/vnd.module.wasm.spec.v1+yaml"),
    ("plugin.tar.gz", "application/vnd.oci.image.layer.v1.tar+gzip"),
]


def plugin_tar_gz(wasm: bytes) -> bytes:
    """A gzipped tar holding only plugin.wasm, with no time, owner or host in it."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo("plugin.wasm")
        info.size, info.mode, info.mtime = len(wasm), 0o644, 0
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        tar.addfile(info, io.BytesIO(wasm))
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=9) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def with_readme_base(spec: bytes, base: str) -> bytes:
    """spec.yaml with its README links under `base` (the two lines, indentation kept)."""
    if not base.startswith("https://"):
        sys.exit(f"--readme-base: an https:// URL, not {base!r}")
    base = base.rstrip("/")
    out, seen = [], 0
    for line in spec.decode().split("\n"):
        key = line.strip().split(":", 1)[0]
        if key in ("readmeUrl", "en-US") and "://" in line:
            name = "README.md" if key == "readmeUrl" else "README_EN.md"
            line = f"{line[: len(line) - len(line.lstrip())]}{key}: {base}/{name}"
            seen += 1
        out.append(line)
    if seen != 2:
        sys.exit(f"--readme-base: spec.yaml has {seen} README links, not 2")
    return "\n".join(out).encode()


def main(argv):
    base = None
    if len(argv) > 2 and argv[1] == "--readme-base":
        base, argv = argv[2], argv[:1] + argv[3:]
    if len(argv) != 7:
        sys.exit(__doc__.split("\n\n")[1])
    out, tag, wasm, spec, readme, readme_en = argv[1:]
    spec_bytes = open(spec, "rb").read()
    if base is not None:
        spec_bytes = with_readme_base(spec_bytes, base)
    files = {
        "plugin.tar.gz": plugin_tar_gz(open(wasm, "rb").read()),
        "spec.yaml": spec_bytes,
        "README.md": open(readme, "rb").read(),
        "README_EN.md": open(readme_en, "rb").read(),
    }
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(os.path.join(out, "blobs", "sha256"))

    def blob(data: bytes, media_type: str, annotations=None) -> dict:
        digest = hashlib.sha256(data).hexdigest()
        with open(os.path.join(out, "blobs", "sha256", digest), "wb") as f:
            f.write(data)
        desc = {"mediaType": media_type, "digest": "sha256:" + digest, "size": len(data)}
        if annotations:
            desc["annotations"] = annotations
        return desc

    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": blob(b"{}", CONFIG),
        "layers": [blob(files[name], mt, {TITLE: name}) for name, mt in LAYERS],
    }
    ref = {"org.opencontainers.image.ref.name": tag}
    index = {"schemaVersion": 2, "manifests": [blob(canonical(manifest), MANIFEST, ref)]}
    with open(os.path.join(out, "index.json"), "wb") as f:
        f.write(canonical(index))
    with open(os.path.join(out, "oci-layout"), "wb") as f:
        f.write(canonical({"imageLayoutVersion": "1.0.0"}))
    print(f"{out}:{tag} {index['manifests'][0]['digest']}")


if __name__ == "__main__":
    main(sys.argv)
