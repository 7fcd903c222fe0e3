"""Where the calls run: threads, one asyncio loop, worker processes, or Ray actors.

Each driver runs a list of jobs with a fixed number of workers, each worker taking the next job
as soon as it is free (so the limiter, not the driver, decides how many are in flight), and
reports every outcome as it arrives. Drivers that can, also kill permit holders on purpose.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from mocksandbox.stress.runner import Job, Outcome, run_job, run_job_async
from mocksandbox.stress.subject import Subject

OnOutcome = Callable[[Outcome], None]


class DriverError(RuntimeError):
    """The driver cannot run this subject (e.g. it cannot be sent to worker processes)."""


def _lost(job: Job, why: str) -> Outcome:
    now = time.time()
    return Outcome(
        job.kind,
        job.index,
        now,
        now,
        result="raised",
        error_type="WorkerLost",
        error_message=why,
        origin="foreign",
        planned_failure=bool(job.spec and job.spec.planned_failure),
    )


class ThreadDriver:
    """``workers`` threads in this process."""

    name = "threads"

    def __init__(self, subject: Subject, workers: int) -> None:
        self.subject = subject
        self.workers = workers

    def run(self, jobs: list[Job], on_outcome: OnOutcome) -> list[Outcome]:
        pending: queue.SimpleQueue[Job] = queue.SimpleQueue()
        for job in jobs:
            pending.put(job)
        outcomes: list[Outcome] = []
        lock = threading.Lock()

        def work() -> None:
            while True:
                try:
                    job = pending.get_nowait()
                except queue.Empty:
                    return
                outcome = run_job(self.subject, job)
                with lock:
                    outcomes.append(outcome)
                    on_outcome(outcome)

        threads = [
            threading.Thread(target=work, name=f"stress-{i}", daemon=True)
            for i in range(min(self.workers, len(jobs)))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return outcomes

    def kill_holders(self, count: int, rebuild: Callable[[], Any] | None = None) -> int:
        raise DriverError("--kill-holders needs --mode processes or ray (a thread cannot be killed)")

    def close(self) -> None:
        pass


class AsyncioDriver:
    """``workers`` tasks on one event loop; blocking HTTP runs in a thread pool of the same size."""

    name = "asyncio"

    def __init__(self, subject: Subject, workers: int) -> None:
        self.subject = subject
        self.workers = workers

    def run(self, jobs: list[Job], on_outcome: OnOutcome) -> list[Outcome]:
        return asyncio.run(self._run(jobs, on_outcome))

    async def _run(self, jobs: list[Job], on_outcome: OnOutcome) -> list[Outcome]:
        pending: asyncio.Queue[Job] = asyncio.Queue()
        for job in jobs:
            pending.put_nowait(job)
        outcomes: list[Outcome] = []
        with ThreadPoolExecutor(max(1, self.workers), thread_name_prefix="stress-http") as threads:

            async def work() -> None:
                while not pending.empty():
                    job = pending.get_nowait()
                    outcome = await run_job_async(self.subject, job, threads)
                    outcomes.append(outcome)
                    on_outcome(outcome)

            await asyncio.gather(*(work() for _ in range(min(self.workers, len(jobs)))))
        return outcomes

    def kill_holders(self, count: int, rebuild: Callable[[], Any] | None = None) -> int:
        raise DriverError("--kill-holders needs --mode processes or ray (a task cannot be killed)")

    def close(self) -> None:
        pass


# -- processes ----------------------------------------------------------------------------------


def _process_worker(subject: Subject, jobs: Any, results: Any, ready: Any) -> None:
    ready.put(os.getpid())
    while True:
        job = jobs.get()
        if job is None:
            return
        results.put(run_job(subject, job))


def _picklable(job: Job) -> bool:
    from multiprocessing.reduction import ForkingPickler

    try:
        ForkingPickler.dumps(job)
    except Exception:
        return False
    return True


def _hold_and_die(subject: Subject, ready: Any) -> None:
    subject.acquire()
    ready.put(os.getpid())
    os._exit(17)  # die holding the permit: no finally, no release


class ProcessDriver:
    """``workers`` worker processes (forkserver: forked from a clean, pre-imported server)."""

    name = "processes"

    def __init__(self, subject: Subject, workers: int, job_timeout: float) -> None:
        self.subject = subject
        self.workers = workers
        self.job_timeout = job_timeout
        context: Any
        try:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(["mocksandbox.stress.runner", "requests"])
        except ValueError:  # no forkserver on this platform
            context = multiprocessing.get_context("spawn")
        self._context = context
        self._jobs = context.Queue()
        self._results = context.Queue()
        ready = context.SimpleQueue()
        self._processes = [
            context.Process(
                target=_process_worker,
                args=(subject, self._jobs, self._results, ready),
                name=f"stress-worker-{i}",
                daemon=True,
            )
            for i in range(workers)
        ]
        try:
            for process in self._processes:
                process.start()
        except Exception as exc:  # typically: the subject cannot be pickled
            self.close()
            raise DriverError(
                f"cannot send the {subject.kind} to worker processes ({type(exc).__name__}: {exc}); "
                "--mode processes needs a picklable limiter or executor"
            ) from None
        # Wait until every worker is up, so that none of them starts late and the load is even.
        deadline = time.monotonic() + max(30.0, job_timeout)
        started = 0
        while started < workers and time.monotonic() < deadline:
            if not ready.empty():
                ready.get()
                started += 1
            elif not any(p.is_alive() for p in self._processes):
                break
            else:
                time.sleep(0.01)

    def run(self, jobs: list[Job], on_outcome: OnOutcome) -> list[Outcome]:
        special = [job for job in jobs if job.subject is not None]
        if special and not _picklable(special[0]):
            # A subject that can only be inherited (a multiprocessing semaphore): give it workers of
            # its own rather than a queue it cannot cross.
            assert special[0].subject is not None
            own = ProcessDriver(special[0].subject, len(jobs), self.job_timeout)
            try:
                return own.run([replace(job, subject=None) for job in jobs], on_outcome)
            finally:
                own.close()
        for job in jobs:
            self._jobs.put(job)
        outcomes: list[Outcome] = []
        waiting = {job.index: job for job in jobs}
        last_progress = time.monotonic()
        while waiting:
            try:
                outcome = self._results.get(timeout=0.5)
            except queue.Empty:
                alive = [p for p in self._processes if p.is_alive()]
                stalled = time.monotonic() - last_progress > self.job_timeout + 30
                if not alive or stalled:
                    why = "every worker process died" if not alive else "no progress: workers stalled"
                    for job in waiting.values():
                        lost = _lost(job, why)
                        outcomes.append(lost)
                        on_outcome(lost)
                    break
                continue
            last_progress = time.monotonic()
            waiting.pop(outcome.index, None)
            outcomes.append(outcome)
            on_outcome(outcome)
        return outcomes

    def kill_holders(self, count: int, rebuild: Callable[[], Any] | None = None) -> int:
        if self.subject.kind != "limiter":
            raise DriverError("--kill-holders needs a limiter (an executor owns its own workers)")
        ready = self._context.SimpleQueue()  # put() is written before os._exit, unlike Queue's
        killed = 0
        for _ in range(count):
            victim = self._context.Process(target=_hold_and_die, args=(self.subject, ready), daemon=True)
            victim.start()
            victim.join(timeout=self.job_timeout)
            if victim.is_alive():
                victim.kill()
                victim.join(timeout=10)
            elif not ready.empty():
                ready.get()
            killed += victim.exitcode == 17
        return killed

    def close(self) -> None:
        for _ in self._processes:
            try:
                self._jobs.put(None)
            except Exception:
                break
        for process in self._processes:
            if process.pid is not None:
                process.join(timeout=5)
                if process.is_alive():
                    process.kill()
                    process.join(timeout=5)


# -- Ray -----------------------------------------------------------------------------------------


class StressWorker:
    """The Ray actor (threaded) that runs jobs through a limiter or a plain executor object."""

    def __init__(self, subject: Subject) -> None:
        self.subject = subject

    def run(self, job: Job) -> Outcome:
        return run_job(self.subject, job)

    def hold_and_die(self) -> None:
        self.subject.acquire()
        os._exit(17)


class StartSignal:
    """A tiny Ray actor counting calls that have started (they hold a permit by then)."""

    def __init__(self) -> None:
        self.started = 0

    def start(self) -> None:
        self.started += 1

    def count(self) -> int:
        return self.started


def signal_and_hold(signal: Any, seconds: float) -> None:
    """Run under an executor's permit: say so, then hold it until killed."""
    import ray

    ray.get(signal.start.remote())
    time.sleep(seconds)


class RayDriver:
    """Threaded ``StressWorker`` actors, one per alive node (up to ``workers``), or, for an executor
    that is a Ray actor handle, threads in the driver calling it (as the seed's callers do)."""

    name = "ray"

    def __init__(self, subject: Subject, workers: int) -> None:
        import ray

        from mocksandbox.ratelimit.ray_limiter import node_ids

        self.subject = subject
        self.workers = workers
        self._local: ThreadDriver | None = None
        self._actors: list[Any] = []
        if subject.is_ray_handle:
            self._local = ThreadDriver(subject, workers)
            return
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes: list[str | None] = list(node_ids()[: max(1, workers)]) or [None]
        per_actor = math.ceil(workers / len(nodes))
        remote = ray.remote(StressWorker)
        for node in nodes:
            options: dict[str, Any] = {"num_cpus": 0, "max_concurrency": per_actor, "max_restarts": 0}
            if node is not None:
                options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=True)
            self._actors.append(remote.options(**options).remote(subject))
        self._remote = remote

    @property
    def nodes(self) -> int:
        return len(self._actors) or 1

    def run(self, jobs: list[Job], on_outcome: OnOutcome) -> list[Outcome]:
        if self._local is not None:
            return self._local.run(jobs, on_outcome)
        import ray

        outcomes: list[Outcome] = []
        queue_ = list(reversed(jobs))
        in_flight: dict[Any, Job] = {}
        turn = 0
        while queue_ or in_flight:
            while queue_ and len(in_flight) < self.workers:
                job = queue_.pop()
                actor = self._actors[turn % len(self._actors)]
                turn += 1
                in_flight[actor.run.remote(job)] = job
            done, _ = ray.wait(list(in_flight), num_returns=1)
            for ref in done:
                job = in_flight.pop(ref)
                try:
                    outcome = ray.get(ref)
                except Exception as exc:
                    outcome = _lost(job, f"{type(exc).__name__}: {exc}"[:300])
                outcomes.append(outcome)
                on_outcome(outcome)
        return outcomes

    def kill_holders(self, count: int, rebuild: Callable[[], Any] | None = None) -> int:
        import ray

        if self.subject.is_ray_handle and rebuild is not None:
            return self._kill_pool_holders(count, rebuild)
        if self.subject.kind != "limiter":
            raise DriverError("--kill-holders needs a limiter, or an executor that is a Ray actor handle")
        killed = 0
        for _ in range(count):
            victim = self._remote.options(num_cpus=0, max_restarts=0).remote(self.subject)
            try:
                ray.get(victim.hold_and_die.remote())
            except ray.exceptions.RayActorError:
                killed += 1
        return killed

    def _kill_pool_holders(self, count: int, rebuild: Callable[[], Any]) -> int:
        """Build one more pool from the factory, let ``count`` of its calls take a permit, kill it."""
        import ray

        signal = ray.remote(StartSignal).options(num_cpus=0).remote()
        victim = rebuild()
        for _ in range(count):
            victim.execute.remote(signal_and_hold, signal, 3600.0)
        deadline = time.monotonic() + 120
        started = 0
        while time.monotonic() < deadline:
            started = ray.get(signal.count.remote())
            if started >= count:
                break
            time.sleep(0.05)
        ray.kill(victim)  # the pool dies with its calls: no finally, no release
        ray.kill(signal)
        return int(started)

    def close(self) -> None:
        import ray

        for actor in self._actors:
            ray.kill(actor)
        self._actors = []
