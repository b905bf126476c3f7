"""The e2b SDK against dsec's E2B API, beside dsec's own SDK on the same server.

Two figures, each path interleaved with its baseline in rounds so that load from other
users of the machine falls on both alike: a sandbox made and its first command run
(``Sandbox.create`` + ``commands.run("true")`` against ``client.create`` +
``sb.exec("true")``), and the command round trip alone on a live sandbox. Both SDKs are
used through their blocking faces, busybox sandboxes of the same size.
"""

from __future__ import annotations

import os
import time

import common

import dsec


def main(quick: bool) -> None:
    rounds, create_n, run_n = (2, 2, 10) if quick else (5, 6, 60)
    with common.server() as srv:
        os.environ.update(E2B_API_URL=f"{srv.url}/e2b", E2B_SANDBOX_URL=f"{srv.url}/e2b/envd",
                          E2B_API_KEY=srv.token)
        from e2b import Sandbox  # reads the URLs above when it connects

        client = dsec.Client(srv.url, srv.token)
        meta = {"dsec.memory_mb": "256"}

        def e2b_create_run() -> None:
            sb = Sandbox.create(template="busybox", metadata=meta)
            sb.commands.run("true")
            sb.kill()

        def dsec_create_run() -> None:
            sb = client.create(image="busybox", memory_mb=256)
            sb.exec("true")
            sb.stop()

        e2b_sb = Sandbox.create(template="busybox", metadata=meta, timeout=3600)
        dsec_sb = client.create(image="busybox", memory_mb=256)

        def e2b_run() -> None:
            e2b_sb.commands.run("true")

        def dsec_run() -> None:
            r = dsec_sb.exec("true")
            assert r.exit_code == 0, r

        create_paths = {"e2b SDK: `Sandbox.create` + `commands.run(\"true\")`": e2b_create_run,
                        "dsec SDK: `client.create` + `sb.exec(\"true\")` (baseline)":
                            dsec_create_run}
        run_paths = {"e2b SDK: `commands.run(\"true\")`": e2b_run,
                     "dsec SDK: `sb.exec(\"true\")` (baseline)": dsec_run}
        for fn in [*create_paths.values(), *run_paths.values()]:
            for _ in range(2 if fn in create_paths.values() else 20):  # warm-up
                fn()
        samples: dict[str, list[float]] = {k: [] for k in [*create_paths, *run_paths]}
        for _ in range(rounds):
            for paths, n in ((create_paths, create_n), (run_paths, run_n)):
                for name, fn in paths.items():
                    for _ in range(n):
                        t0 = time.perf_counter()
                        fn()
                        samples[name].append(time.perf_counter() - t0)
        e2b_sb.kill()
        dsec_sb.stop()
        client.close()
    left = srv.left
    rows = []
    for group in (create_paths, run_paths):
        names = list(group)
        base = common.percentile(samples[names[1]], 50)
        for name in names:
            s = common.summary(samples[name])
            rows.append([name, s["n"], common.fmt_ms(s["p50"]), common.fmt_ms(s["p90"]),
                         common.ratio(s["p50"], base)])
    body = common.table(["path", "n", "p50 ms", "p90 ms", "p50 / dsec SDK"], rows)
    notes = ["One embedded server; e2b 2.63.0 (`E2B_API_URL=<dsec>/e2b`, "
             "`E2B_SANDBOX_URL=<dsec>/e2b/envd`) beside dsec's blocking `Client`, busybox "
             "sandboxes of 256 MiB.",
             "Create + first run includes the kill/stop of each sandbox in both paths (it "
             "is sequential with the next create).",
             "The e2b command is a Connect server stream (`/bin/bash -l -c true` as the "
             "SDK sends it; busybox has no bash, so `sh -l -c true`), run as a node "
             "background process (started, then followed by pid, so `commands.connect` and "
             "`send_stdin` reach it and it outlives a node restart); dsec's is one JSON "
             "request (`/bin/sh -c true`).",
             f"{rounds} interleaved rounds of {create_n} creates and {run_n} runs per path, "
             "after a warm-up.",
             "Cleanup after stop: " + ("nothing left" if not left else ", ".join(left))]
    name = "e2b-quick" if quick else "e2b"
    common.publish(name, "E2B SDK against dsec" + (" (quick)" if quick else ""), body, notes)
    if left:
        raise SystemExit(f"leftovers: {left}")


if __name__ == "__main__":
    main(common.parse_args(__doc__).quick)
