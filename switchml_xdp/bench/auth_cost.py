"""What signing a RESULT costs the user-space data plane and checking it
costs a worker: ns per RESULT of xdp/swml_auth.h compiled as they compile it
(cc -O2), over the header alone and over header and payload, for each payload
size. The XDP switch's figure, per packet and against the unsigned program,
is switch_micro's (`--auth header|full`; docs/security.md).

    python -m switchml_xdp.bench.auth_cost [--k 64,256] [--json]
"""
from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import click

from .. import wire
from ..bpf.compile import xdp_dir
from .output import echo_rows

# A loop over n RESULTs in a buffer as the switch has them (header + payload),
# each signed (swml_result_auth, what the data planes call); the time of the loop / n. The tag feeds the next
# header so that the compiler cannot drop or overlap the work.
PROGRAM = r"""
#include <linux/types.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "swml_auth.h"

int main(int argc, char **argv)
{
    unsigned len = atoi(argv[1]), auth = atoi(argv[2]), n = atoi(argv[3]);
    static __u8 buf[SWML_HDR_LEN + 4 * SWML_MAX_K];
    __u64 key[2] = {0x0706050403020100ULL, 0x0f0e0d0c0b0a0908ULL}, tag = 0;
    struct timespec t0, t1;

    memset(buf, 0x5a, sizeof(buf));
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (unsigned i = 0; i < n; i++) {
        memcpy(buf + 12, &tag, 4);
        tag = swml_result_auth(key, auth, buf, len);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("%.1f %llx\n", ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / n,
           (unsigned long long)tag);
    return 0;
}
"""


def ns_per_result(binary: Path, payload_len: int, auth: int, n: int = 200_000) -> float:
    runs = [float(subprocess.run([str(binary), str(payload_len), str(auth), str(n)],
                                 capture_output=True, text=True, check=True).stdout.split()[0])
            for _ in range(5)]
    return min(runs)  # the least disturbed of five


@click.command()
@click.option("--k", "ks", default="64,256", show_default=True,
              help="elements a packet, comma-separated")
@click.option("--json", "as_json", is_flag=True)
def main(ks, as_json):
    """ns per RESULT of the authenticator in C (the user-space data plane, the workers)."""
    with tempfile.TemporaryDirectory() as tmp:
        src, binary = Path(tmp) / "auth_cost.c", Path(tmp) / "auth_cost"
        src.write_text(PROGRAM)
        subprocess.run([os.environ.get("CC", "cc"), "-O2", "-std=gnu11", f"-I{xdp_dir()}",
                        "-o", str(binary), str(src)], check=True)
        rows = []
        for k in (int(x) for x in ks.split(",")):
            for fmt, size in (("int32", 4), ("int16", 2)):
                rows.append({"k": k, "fmt": fmt,
                             "header_ns": ns_per_result(binary, 0, wire.AUTH_HEADER),
                             "full_ns": ns_per_result(binary, k * size, wire.AUTH_FULL)})
    echo_rows(rows, as_json, f"{'k':>4} {'payload':>8} {'header':>8} {'full':>8}  (ns/RESULT)",
              lambda r: f"{r['k']:>4} {r['fmt']:>8} {r['header_ns']:>8.1f} {r['full_ns']:>8.1f}",
              "SipHash-2-4 of xdp/swml_auth.h, cc -O2, one core; min of 5 runs of 200,000 RESULTs. "
              "header: the 24 header bytes; full: and the payload.")


if __name__ == "__main__":
    main()
