"""Shared pieces of the "frames until the mean of the last 20 returns reaches 475" benchmarks.

Each run happens in a fresh subprocess (``python <script> --child NAME SEED FRAMES``) so runs
do not share torch threads, caches or collector processes; the parent collects one
``RESULT {json}`` line per run and writes a median table.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import write_markdown

THRESHOLD = 475.0
"""CartPole-v1's "solved" return (the mean over the last 20 finished episodes)."""


def run_recipe(train: Callable[[], Iterator[dict]]) -> dict:
    """Run one of our recipes (``train()`` yields metrics) and time it to the threshold.

    Wall time counts from before ``train()`` builds the model and collector.
    """
    start = time.perf_counter()
    hit, last = None, {}
    for metrics in train():
        last = metrics
        if (
            hit is None
            and metrics["train/return_window_size"] >= 20
            and metrics["train/return_window"] >= THRESHOLD
        ):
            hit = (metrics["time/frames"], time.perf_counter() - start)
    wall = time.perf_counter() - start
    return {
        "frames_to_475": hit[0] if hit else None,
        "seconds_to_475": hit[1] if hit else None,
        "frames": last["time/frames"],
        "seconds": wall,
        "fps": last["time/frames"] / wall,
    }


def run_until_threshold(train: Callable[[], Iterator[dict]]) -> dict:
    """Like :func:`run_recipe`, but stops the run once the 20-episode mean reaches 475.

    ``frames``, ``seconds`` and ``fps`` then cover the run up to that point (closing the
    generator stops the collector); a run that never reaches it goes to its budget.
    ``best_window`` is the best 20-episode mean seen.
    """
    start = time.perf_counter()
    hit, last, best = None, {}, -math.inf
    run = train()
    for metrics in run:
        last = metrics
        if metrics["train/return_window_size"] >= 20:
            best = max(best, metrics["train/return_window"])
            if metrics["train/return_window"] >= THRESHOLD:
                hit = (metrics["time/frames"], time.perf_counter() - start)
                break
    run.close()
    wall = time.perf_counter() - start
    return {
        "frames_to_475": hit[0] if hit else None,
        "seconds_to_475": hit[1] if hit else None,
        "frames": last["time/frames"],
        "seconds": wall,
        "fps": last["time/frames"] / wall,
        "best_window": best,
    }


def run_sb3_ppo(
    seed: int,
    frames: int,
    *,
    n_envs: int = 8,
    n_steps: int = 32,
    lr: float = 1e-3,
    threads: int = 2,
    stop_at_threshold: bool = False,
) -> dict:
    """Stable-Baselines3 PPO on CartPole-v1 with rl-baselines3-zoo's settings, timed to 475.

    The zoo's CartPole settings (batch 256, 20 epochs, γ 0.98, λ 0.8, lr and clip 0.2 annealed
    linearly, no entropy bonus) with ``n_envs``, ``n_steps`` and the initial ``lr`` as given.
    Returns the same keys as :func:`run_recipe`; with ``stop_at_threshold`` training stops
    when the mean of the last 20 finished episodes first reaches 475, as in
    :func:`run_until_threshold`. Needs ``pip install stable-baselines3``.
    """
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(threads)
    start = time.perf_counter()
    callback = _threshold_callback(start, stop_at_threshold)
    env = make_vec_env("CartPole-v1", n_envs=n_envs, seed=seed)

    def linear(value):
        return lambda remaining: remaining * value

    model = PPO(
        "MlpPolicy",
        env,
        n_steps=n_steps,
        batch_size=256,
        gae_lambda=0.8,
        gamma=0.98,
        n_epochs=20,
        ent_coef=0.0,
        learning_rate=linear(lr),
        clip_range=linear(0.2),
        seed=seed,
        device="cpu",
        verbose=0,
    )
    model.learn(total_timesteps=frames, callback=callback)
    return _sb3_result(model, callback, start)


def run_sb3_a2c(
    seed: int, frames: int, *, threads: int = 2, stop_at_threshold: bool = True
) -> dict:
    """Stable-Baselines3 A2C on CartPole-v1 with rl-baselines3-zoo's settings, timed to 475.

    The zoo's ``hyperparams/a2c.yml`` CartPole-v1 entry (8 envs, no entropy bonus) on SB3's A2C
    defaults (n_steps 5, RMSprop lr 7e-4 with α 0.99 and eps 1e-5, γ 0.99, GAE λ 1, value
    coefficient 0.5, gradient-norm clip 0.5). Returns the keys of :func:`run_until_threshold`
    (``best_window`` included); with ``stop_at_threshold`` training stops at 475.
    """
    import torch
    from stable_baselines3 import A2C
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(threads)
    start = time.perf_counter()
    callback = _threshold_callback(start, stop_at_threshold)
    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    model = A2C("MlpPolicy", env, ent_coef=0.0, seed=seed, device="cpu", verbose=0)
    model.learn(total_timesteps=frames, callback=callback)
    return _sb3_result(model, callback, start) | {"best_window": callback.best}


def _sb3_result(model, callback, start: float) -> dict:
    """The keys of :func:`run_recipe` for a finished SB3 ``model`` timed from ``start``."""
    wall = time.perf_counter() - start
    return {
        "frames_to_475": callback.hit[0] if callback.hit else None,
        "seconds_to_475": callback.hit[1] if callback.hit else None,
        "frames": model.num_timesteps,
        "seconds": wall,
        "fps": model.num_timesteps / wall,
    }


def _threshold_callback(start: float, stop_at_threshold: bool):
    """An SB3 callback recording when the mean of the last 20 finished returns reaches 475."""
    from stable_baselines3.common.callbacks import BaseCallback

    class Threshold(BaseCallback):
        def __init__(self):
            super().__init__()
            self.window = deque(maxlen=20)
            self.hit, self.best = None, -math.inf

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" not in info:
                    continue
                self.window.append(info["episode"]["r"])
                if len(self.window) < 20:
                    continue
                mean = sum(self.window) / 20
                self.best = max(self.best, mean)
                if self.hit is None and mean >= THRESHOLD:
                    self.hit = (self.num_timesteps, time.perf_counter() - start)
                    if stop_at_threshold:
                        return False  # stops model.learn
            return True

    return Threshold()


def median(values) -> float | None:
    """Median of the values that are not None (None if there are none)."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def run_child(script: str, name: str, seed: int, frames: int, timeout: int = 900) -> dict:
    """Run ``script --child name seed frames`` and return its ``RESULT`` dict (plus seed)."""
    out = subprocess.run(
        [sys.executable, script, "--child", name, str(seed), str(frames)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    if not line:
        raise RuntimeError(f"{name} seed {seed} failed:\n{out.stderr[-3000:]}")
    return json.loads(line[-1][7:]) | {"seed": seed}


def run_seeds(
    script: str,
    names: list[str],
    seeds: list[int],
    frames: int | dict[str, int],
    timeout: int = 900,
    jobs: int = 1,
) -> dict[str, list[dict]]:
    """Every name for every seed, seed by seed, each a fresh child (:func:`run_child`).

    ``frames`` is one budget for all, or one per name. With ``jobs`` > 1 that many children
    run at once (frames to the threshold stay comparable; seconds and fps then share the
    machine). Prints each result as it arrives; each name's results are in ``seeds`` order.
    """
    width = max(map(len, names))
    order = [(seed, name) for seed in seeds for name in names]

    def one(pair: tuple[int, str]) -> dict:
        seed, name = pair
        budget = frames[name] if isinstance(frames, dict) else frames
        result = run_child(script, name, seed, budget, timeout=timeout)
        print(f"{name:{width}s} seed {seed}: {describe_run(result)}", flush=True)
        return result

    if jobs > 1:
        with ThreadPoolExecutor(jobs) as pool:
            results = list(pool.map(one, order))
    else:
        results = [one(pair) for pair in order]
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for (_, name), result in zip(order, results, strict=True):
        runs[name].append(result)
    return runs


def describe_run(result: dict) -> str:
    """One run's numbers for people.

    Example: ``475 at 34,304 frames (9.2 s); 100,352 frames in 30.7 s, 3,271 fps``.
    """
    frames, seconds = result.get("frames_to_475"), result.get("seconds_to_475")
    if frames is None:
        best = result.get("best_window")
        reached = "475 not reached" + (f" (best window {best:,.1f})" if best is not None else "")
    else:
        reached = f"475 at {frames:,.0f} frames" + (f" ({seconds:,.1f} s)" if seconds else "")
    if not all(key in result for key in ("frames", "seconds", "fps")):
        return reached
    frames, seconds, fps = result["frames"], result["seconds"], result["fps"]
    return f"{reached}; {frames:,.0f} frames in {seconds:,.1f} s, {fps:,.0f} fps"


def write_table(
    runs: dict[str, list[dict]],
    baseline: str,
    out: Path,
    header: str,
    seconds_ratio: bool = False,
) -> dict[str, dict]:
    """Median table with ratios against ``baseline``; writes ``out`` (.md) and ``.json``.

    With ``seconds_ratio`` the table also gives the ratio of the median seconds to 475.
    """
    keys = ("frames_to_475", "seconds_to_475", "fps")
    base = {k: median(r[k] for r in runs[baseline]) for k in keys}
    rows = [
        "| run | seeds reaching 475 | frames to 475 (median) | s to 475 (median) | fps "
        f"(median) | frames ratio vs {baseline} | fps ratio vs {baseline} |"
        + (f" s ratio vs {baseline} |" if seconds_ratio else ""),
        "|---|---|---|---|---|---|---|" + ("---|" if seconds_ratio else ""),
    ]

    def fmt(x, spec):
        return "—" if x is None else format(x, spec)

    summary = {}
    for name, results in runs.items():
        med = {k: median(r[k] for r in results) for k in keys}
        reached = sum(r["frames_to_475"] is not None for r in results)
        frames_ratio = (
            med["frames_to_475"] / base["frames_to_475"]
            if med["frames_to_475"] and base["frames_to_475"]
            else None
        )
        fps_ratio = med["fps"] / base["fps"]
        summary[name] = med | {"reached": reached, "frames_ratio": frames_ratio}
        summary[name]["fps_ratio"] = fps_ratio
        row = (
            f"| {name} | {reached}/{len(results)} | {fmt(med['frames_to_475'], ',.0f')} "
            f"| {fmt(med['seconds_to_475'], '.1f')} | {med['fps']:,.0f} | "
            f"{fmt(frames_ratio, '.2f')} | {fps_ratio:.2f} |"
        )
        if seconds_ratio:
            ratio = (
                med["seconds_to_475"] / base["seconds_to_475"]
                if med["seconds_to_475"] and base["seconds_to_475"]
                else None
            )
            summary[name]["seconds_ratio"] = ratio
            row += f" {fmt(ratio, '.2f')} |"
        rows.append(row)
    table = "\n".join(rows)
    print("\n" + table)
    per_run = "\n".join(
        f"- {name}, seed {r['seed']}: {describe_run(r)}"
        for name, results in runs.items()
        for r in results
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    write_markdown(out, header + table + "\n\nPer run:\n\n" + per_run + "\n")
    out.with_suffix(".json").write_text(json.dumps({"runs": runs, "summary": summary}, indent=1))
    print(f"wrote {out}")
    return summary
