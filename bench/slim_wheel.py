"""Rewrite a wheel without some files, with a RECORD that matches (pip checks nothing else).

usage: slim_wheel.py WHEEL --drop PREFIX_SUBSTRING [--keep SUBSTRING ...]
A member whose path contains a --drop substring is removed unless it also contains a --keep substring.
"""

import argparse
import base64
import hashlib
import os
import zipfile


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("wheel")
    p.add_argument("--drop", action="append", default=[])
    p.add_argument("--keep", action="append", default=[])
    a = p.parse_args()
    src = a.wheel
    tmp = src + ".tmp"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
        record_name = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
        rows = []
        for info in zin.infolist():
            n = info.filename
            if n == record_name:
                continue
            if any(d in n for d in a.drop) and not any(k in n for k in a.keep):
                continue
            data = zin.read(n)
            zout.writestr(info, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append(f"{n},sha256={digest},{len(data)}")
        rows.append(f"{record_name},,")
        zout.writestr(record_name, "\n".join(rows) + "\n")
    os.replace(tmp, src)
    print(f"{src}: {os.path.getsize(src) / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
