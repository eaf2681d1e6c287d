"""Worker throughput with a slow fake LLM, pool choice and per-job CPU, as markdown.

Real Celery worker processes (``celery -A workers.app worker``) consume
real ``compaction.maybe_summarize`` jobs from a Redis broker; each job
compacts one session in the Redis store and makes exactly one summarizer
call to a fake OpenAI-compatible server answering after ``--latency``
seconds (the fake runs in its own process, so its CPU is accounted apart).

The sessions are copies (server-side ``COPY``) of one template built the way
an agent builds it: turns recorded through ``ContextGuard`` until the
worker's own plan (``Compactor.plan``) says compaction is due with a cut on
a turn boundary, i.e. one LLM call, no split-turn prefix call, no folding.

Recall indexing (issue 16) runs as its own low-priority job after each
compaction (``COMPACTION_RECALL_INDEX=task``, the default); a configuration
suffixed ``@index-in-job`` indexes in the compaction job instead, ``@no-index``
not at all. Each run also times until every session's index covers its
summary ("until indexed": index jobs included), and the report gives the
in-process cost of indexing one job's range (worker and Redis CPU, Redis
commands).

A configuration suffixed ``@llm-only`` runs the same worker configuration,
broker, publish path and task name with a job that only makes that LLM call
(same request, same SDK client) and marks the session summarized: the
ceiling of the pool, the broker and the SDK, so that the gap to the real job
is the job's own work.

For every configuration: workers start, a warm-up batch lets each process
(each prefork child) build its runtime, the workers stop consuming
(``cancel_consumer``), ``--seconds`` worth of jobs at the ideal rate
(concurrency / latency) are published with ``request_summary``, and the
clock starts when consumption resumes (``add_consumer``); the run ends when
every session holds its LLM summary. Publishing is kept out of the window:
the agents that publish run on other machines.
Reported: jobs/s against the ideal, CPU per job (worker processes, fake,
Redis), the CPUs the workers kept busy, the other load on the machine while
timed, memory per worker, then where one job's CPU goes (cProfile with a CPU
clock, in-process, fake at zero latency). Every figure is the median of
``--rounds`` rounds, configurations interleaved within each round, so ratios
compare runs made minutes apart under similar load.

    .venv/bin/python scripts/bench_workers.py [--redis-url redis://127.0.0.1:6379/5]
        [--broker-url redis://127.0.0.1:6379/6] [--latency 0.5] [--window 32000]
        [--configs threads:32x1,threads:32x2,prefork:32x1,threads:32x1@llm-only,
                   threads:32x1@index-in-job,threads:32x1@no-index,...]
        [--rounds 3] [--py-spy PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import uuid
from dataclasses import replace
from pathlib import Path

import redis
from _timing import (
    loadavg,
    wait_for_quiet,
)
from _workers_fake import SUMMARIZER_MODEL, fake_capacity, fake_llm
from _workers_index import index_cost, report_index_cost
from _workers_llm_only import store_request
from _workers_pool import Bench, Config, RunResult, median_of, parse_configs
from _workers_profile import profile_jobs, spy_breakdown
from _workers_sessions import build_template

from shared.core.config import StoreConfig
from shared.enqueue import (
    QUEUE,
    CeleryEnqueuer,
    publisher_app,
)
from shared.store.sessions import SessionStore, connect
from workers.harness.fakes.counting import char_counter


def report(bench: Bench) -> None:
    args, template = bench.args, bench.template
    configs = parse_configs(args.configs)
    print("## Worker throughput and pool\n")
    flags = " ".join(sys.argv[1:])
    print(f"Command: `.venv/bin/python scripts/bench_workers.py{' ' + flags if flags else ''}` "
          "(real `celery -A workers.app "
          "worker` processes, Redis broker and store on 127.0.0.1:6379 in their own dbs, "
          f"fake OpenAI server in its own process answering after {args.latency * 1000:.0f} ms; "
          f"{args.rounds} rounds, configurations interleaved; medians over rounds; "
          f"{os.cpu_count()} CPUs shared with other users).\n")

    request_tokens = char_counter()(template.request, None)
    capacity, served = fake_capacity(bench.fake, template.request, args.fake_clients,
                                     args.fake_seconds)
    print(f"Jobs: `compaction.maybe_summarize` published with `request_summary` (pending flag + "
          f"`CeleryEnqueuer`) while the workers' consumers are cancelled, timed from "
          "`add_consumer` to the last commit; one session each: a copy of a "
          f"{template.messages}-message "
          f"session (~{template.tokens} estimated tokens, window {args.window}) recorded "
          "through `ContextGuard`; each job loads the view, plans, summarizes messages "
          f"[0, {template.summarized_messages}) (~{template.summarized_tokens} tokens, a "
          f"~{request_tokens}-token request) in exactly one LLM call on a turn boundary, "
          "commits through the CAS (the view after it is derived, not read again).\n")
    print(f"Fake LLM capacity: {capacity:.0f} requests/s with {args.fake_clients} concurrent "
          f"SDK clients sending that request at {args.latency * 1000:.0f} ms latency "
          f"({served} requests in {args.fake_seconds:.0f} s; ideal "
          f"{args.fake_clients / args.latency:.0f}/s): "
          f"{'not the bottleneck' if capacity > 64 else 'TOO SLOW'} for 64 jobs/s"
          + (" per process pair." if capacity > 128 else ".") + "\n")

    results: dict[Config, list[RunResult]] = {c: [] for c in configs}
    fd, spy_name = tempfile.mkstemp(prefix="bench_workers_spy_", suffix=".txt")
    os.close(fd)
    spy_path = Path(spy_name)
    try:
        for _ in range(args.rounds):
            for config in configs:
                busy = wait_for_quiet(args.quiet, args.quiet_wait)
                results[config].append(bench.run(config, busy=busy))
        print_results(results)
        verdicts(results)
        if args.py_spy:
            busy = wait_for_quiet(args.quiet, args.quiet_wait)
            spied = bench.run(Config("threads", 32, 1), busy=busy, spy_output=spy_path)
        if args.py_spy and spy_path.stat().st_size:
            samples, spy_parts, spy_table = spy_breakdown(spy_path, args.profile_top)
            print("\nWhere the worker's GIL time goes (threads -c 32 x 1, an extra run with "
                  "py-spy `--gil` sampling the thread that holds the GIL at 100 Hz for "
                  f"{max(2, int(args.seconds * 0.6))} s mid-run, {samples} samples; sampling "
                  f"pauses the process, the run made {spied.rate:.1f} jobs/s; inclusive "
                  "shares):\n")
            print("| part | share of GIL-holding samples |")
            print("|---|---|")
            for label, share in spy_parts:
                print(f"| {label} | {share:.0%} |")
            print("\n" + "\n".join(spy_table))
    finally:
        spy_log = spy_path.with_suffix(".log")
        if args.py_spy and spy_log.exists() and not spy_path.stat().st_size:
            print(f"\n(py-spy recorded nothing: {spy_log.read_text(errors='replace')[-500:]})")
        spy_path.unlink(missing_ok=True)
        spy_log.unlink(missing_ok=True)

    print("\n" + "\n".join(report_index_cost(index_cost(
        bench.store, template, bench.redis_pid, jobs=args.index_jobs))))
    profile(bench)
    size_sweep(bench)


def profile(bench: Bench) -> None:
    args = bench.args
    if args.profile_jobs < 1:
        return
    per_job, parts, table = profile_jobs(bench, args.profile_jobs, args.profile_top)
    print(f"\nWhere one job's CPU goes without Celery (in-process `Compactor.run` on the same "
          f"sessions, fake at zero latency in its own process): {per_job:.1f} CPU ms per job. "
          f"Shares from cProfile on the thread's CPU clock over {args.profile_jobs} jobs "
          "(inclusive; the profiler inflates Python-heavy parts, so the ms column is the share "
          "times the unprofiled figure, approximate):\n")
    print("| part | share of `Compactor.run` | ~CPU ms per job |")
    print("|---|---|---|")
    for label, share in parts:
        print(f"| {label} | {share:.0%} | {share * per_job:.1f} |")
    print("\nTop functions by own CPU time:\n")
    print("\n".join(table))


def size_sweep(bench: Bench) -> None:
    """threads -c 32 x 1 with smaller and larger sessions (one run each)."""
    args = bench.args
    windows = [int(w) for w in args.size_sweep.split(",") if w.strip()]
    if not windows:
        return
    print("\nJob size (threads -c 32 x 1 process, one run per window; the job's summarized "
          "range grows with the window the agent fills):\n")
    print("| window | session tokens | summarized tokens | jobs/s | of ideal 64 | "
          "worker CPU ms/job | worker CPUs busy | other load during |")
    print("|---|---|---|---|---|---|---|---|")
    for window in [*windows, args.window]:
        try:
            template = (bench.template if window == args.window
                        else build_template(bench.store, window, args.seed))
        except SystemExit as exc:
            print(f"| {window} | - | - | - | - | - | no template: {exc} |")
            continue
        sized = replace(bench, template=template)
        busy = wait_for_quiet(args.quiet, args.quiet_wait)
        result = sized.run(Config("threads", 32, 1), busy=busy)
        print(f"| {window} | {template.tokens} | {template.summarized_tokens} | "
              f"{result.rate:.1f} | {result.rate / 64:.0%} | {result.worker_cpu_ms:.1f} | "
              f"{result.worker_cores:.2f} | {result.others_during:.0%} |")
        if template is not bench.template:
            bench.store.delete_session(template.session_id)


def print_results(results: dict[Config, list[RunResult]]) -> None:
    print("| pool (job) | jobs per run | ideal jobs/s | jobs/s (median) | of ideal | steady "
          "jobs/s (10-90%) | runs (jobs/s) | worker CPU ms/job | worker CPUs busy | fake CPU "
          "ms/job | Redis CPU ms/job | until indexed: jobs/s, worker / Redis CPU ms/job | "
          "other load during (per run) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for runs in results.values():
        rate = median_of(runs, lambda r: r.rate)
        print(f"| {runs[0].label} | {runs[0].jobs} | {runs[0].ideal:.0f} | {rate:.1f} | "
              f"{rate / runs[0].ideal:.0%} | {median_of(runs, lambda r: r.steady):.1f} | "
              f"{', '.join(f'{r.rate:.1f}' for r in runs)} | "
              f"{median_of(runs, lambda r: r.worker_cpu_ms):.1f} | "
              f"{median_of(runs, lambda r: r.worker_cores):.2f} | "
              f"{median_of(runs, lambda r: r.fake_cpu_ms):.1f} | "
              f"{median_of(runs, lambda r: r.redis_cpu_ms):.1f} | {_indexed(runs)} | "
              f"{', '.join(f'{r.others_during:.0%}' for r in runs)} |")

    print("\n| pool (job) | OS processes | RSS MiB (total) | PSS MiB (total) | PSS MiB per slot "
          "| start s | warm-up s (first job of each slot) | LLM calls / jobs | LLM summaries "
          "| tracebacks |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for config, runs in results.items():
        print(f"| {runs[0].label} | {runs[0].os_processes} | "
              f"{median_of(runs, lambda r: r.rss):.0f} | {median_of(runs, lambda r: r.pss):.0f} "
              f"| {median_of(runs, lambda r: r.pss) / config.slots:.1f} | "
              f"{median_of(runs, lambda r: r.start_seconds):.1f} | "
              f"{median_of(runs, lambda r: r.warmup_seconds):.1f} | "
              f"{sum(r.llm_calls for r in runs)} / {sum(r.jobs for r in runs)} | "
              f"{sum(r.llm_summaries for r in runs)} | {sum(r.errors for r in runs)} |")


def _indexed(runs: list[RunResult]) -> str:
    """Jobs/s and worker CPU per job until every index covered its summary."""
    if not all(r.indexed_wall for r in runs):
        return "-"
    return (f"{median_of(runs, lambda r: r.indexed_rate):.1f}, "
            f"{median_of(runs, lambda r: r.indexed_cpu_ms):.1f} / "
            f"{median_of(runs, lambda r: r.indexed_redis_ms):.1f}")


def verdicts(results: dict[Config, list[RunResult]]) -> None:
    """The issue's targets, for the real job and for the LLM-only job (same rounds)."""
    print("\nTargets (ratios within the same round):\n")
    for llm_only in (False, True):
        job = "LLM-only job" if llm_only else "real job"
        one = results.get(Config("threads", 32, 1, llm_only))
        two = results.get(Config("threads", 32, 2, llm_only))
        if one:
            rate = median_of(one, lambda r: r.rate)
            cpu = median_of(one, lambda r: r.worker_cpu_ms)
            print(f"- {job}, one process, threads -c 32: {rate:.1f} jobs/s = {rate / 64:.0%} of "
                  f"the ideal 64 ({'met' if rate >= 0.85 * 64 else 'NOT met'}, target >= 85%); "
                  f"at {cpu:.1f} worker CPU ms per job one process (one GIL) cannot exceed "
                  f"{1000 / cpu:.0f} jobs/s even on an idle CPU.")
        if one and two:
            ratios = [b.rate / a.rate for a, b in zip(one, two, strict=True)]
            ratio = statistics.median(ratios)
            print(f"- {job}, two processes / one: {ratio:.2f}x (per round: "
                  f"{', '.join(f'{r:.2f}' for r in ratios)}; "
                  f"{'met' if ratio >= 1.8 else 'NOT met'}, target >= 1.8x).")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/5",
                        help="session store (own db; unique key prefix, cleaned up)")
    parser.add_argument("--broker-url", default="redis://127.0.0.1:6379/6",
                        help="Celery broker (own db: the queue is purged before and after)")
    parser.add_argument("--latency", type=float, default=0.5, help="fake LLM latency, seconds")
    parser.add_argument("--window", type=int, default=32_000,
                        help="the agent model's context window the sessions fill")
    parser.add_argument("--configs", default="threads:32x1,threads:32x2,prefork:32x1,"
                        "threads:32x1@llm-only,threads:32x2@llm-only",
                        help="pool:CONCURRENCYxPROCESSES[@llm-only], comma separated")
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="jobs per run = ideal rate x this")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fake-clients", type=int, default=96)
    parser.add_argument("--fake-seconds", type=float, default=5.0)
    parser.add_argument("--profile-jobs", type=int, default=30,
                        help="jobs profiled in-process with cProfile (0: no profile)")
    parser.add_argument("--index-jobs", type=int, default=40,
                        help="ranges indexed in-process per round for the indexing cost")
    parser.add_argument("--profile-top", type=int, default=15)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--size-sweep", default="8000,128000",
                        help="other windows to run threads -c 32 x 1 with (empty: none)")
    parser.add_argument("--py-spy", default=shutil.which("py-spy"),
                        help="py-spy binary: sample the worker's GIL holder mid-run")
    parser.add_argument("--quiet", type=float, default=0.5,
                        help="wait before each run until other load is under this share")
    parser.add_argument("--quiet-wait", type=float, default=0.0,
                        help="longest wait for a quiet machine per run, seconds (0: none)")
    args = parser.parse_args(argv)
    run(args)
    return 0


def broker_keys(url: str) -> set[bytes]:
    client = redis.Redis.from_url(url)
    try:
        return set(client.scan_iter(count=1000))
    finally:
        client.close()


def clean_broker(url: str, before: set[bytes]) -> None:
    """Drop the queue and whatever kombu created in the broker db during the run."""
    client = redis.Redis.from_url(url)
    client.delete(QUEUE, "unacked", "unacked_index", "unacked_mutex")
    for key in set(client.scan_iter(count=1000)) - before:
        client.delete(key)
    client.close()


def run(args: argparse.Namespace) -> None:
    prefix = "bw" + uuid.uuid4().hex[:8]
    config = StoreConfig(key_prefix=prefix, socket_timeout=10, connect_timeout=5)
    client = connect(args.redis_url, config)
    store = SessionStore(client, config)
    broker_before = broker_keys(args.broker_url)
    clean_broker(args.broker_url, broker_before)  # stale jobs of an interrupted run
    load_before = loadavg()
    redis_pid = int(client.info("server").get("process_id", 0))
    try:
        template = build_template(store, args.window, args.seed)
        store_request(store, template)
        with fake_llm(args.latency) as fake:
            env = {"COMPACTION_BROKER_URL": args.broker_url, "COMPACTION_REDIS_URL": args.redis_url,
                   "COMPACTION_KEY_PREFIX": prefix, "COMPACTION_SUMMARIZER": "openai",
                   "COMPACTION_SUMMARIZER_BASE_URL": fake.base_url,
                   "COMPACTION_SUMMARIZER_API_KEY": "bench",
                   "COMPACTION_SUMMARIZER_MODEL": SUMMARIZER_MODEL,
                   "COMPACTION_SUMMARIZER_TIMEOUT": "60", "PYTHONUNBUFFERED": "1"}
            app = publisher_app(args.broker_url, timeout=5)
            report(Bench(args, store, template, fake, CeleryEnqueuer(app), env, redis_pid,
                         app.control))
    finally:
        for key in client.scan_iter(match=f"{prefix}:*", count=1000):
            client.delete(key)
        clean_broker(args.broker_url, broker_before)
    print(f"\nLoad average (1, 5, 15 min): {load_before} before, {loadavg()} after.")


if __name__ == "__main__":
    raise SystemExit(main())
