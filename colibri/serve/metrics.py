"""The server's counters and their Prometheus text (exposition format 0.0.4), for GET /metrics.
The scheduler thread and the event loop both write them: one lock."""
import threading
from collections import Counter

# the decode step's histogram buckets, in seconds: a small model's step is well under a millisecond,
# a large one's on a slow disk tens of milliseconds or more
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Metrics:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests = Counter()          # (endpoint, status) -> answered requests
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.step_counts = [0] * (len(STEP_BUCKETS) + 1)   # the last: above every bucket
        self.step_seconds = 0.0
        self.steps = 0

    def request(self, endpoint, status):
        with self.lock:
            self.requests[endpoint, status] += 1

    def tokens(self, prompt=0, generated=0):
        with self.lock:
            self.prompt_tokens += prompt
            self.generated_tokens += generated

    def step(self, seconds):
        with self.lock:
            self.steps += 1
            self.step_seconds += seconds
            self.step_counts[next((i for i, b in enumerate(STEP_BUCKETS) if seconds <= b), len(STEP_BUCKETS))] += 1

    def text(self, gauges, cache):
        """The exposition: the counters, `gauges` ({name: (help, value)}) and the expert cache's
        counters `cache` (Session.expert_cache_stats(), None when the experts are resident)."""
        with self.lock:
            lines = ["# HELP colibri_requests_total Answered requests, by endpoint and HTTP status.",
                     "# TYPE colibri_requests_total counter"]
            lines += [f'colibri_requests_total{{endpoint="{e}",status="{s}"}} {n}'
                      for (e, s), n in sorted(self.requests.items())]
            lines += _one("colibri_prompt_tokens_total", "counter", "Prompt tokens of the requests started.",
                          self.prompt_tokens)
            lines += _one("colibri_generated_tokens_total", "counter", "Tokens generated.", self.generated_tokens)
            for name, (help_text, value) in gauges.items():
                lines += _one(name, "gauge", help_text, value)
            if cache is not None:
                demanded = cache["hits"] + cache["misses"]
                lines += _one("colibri_expert_cache_hits_total", "counter", "Routed experts found in the cache.",
                              cache["hits"])
                lines += _one("colibri_expert_cache_misses_total", "counter", "Routed experts read from storage.",
                              cache["misses"])
                lines += _one("colibri_expert_cache_hit_ratio", "gauge", "Hits over hits and misses, since the start.",
                              cache["hits"] / demanded if demanded else 0.0)
            lines += ["# HELP colibri_decode_step_seconds The time of one batched step over every running request.",
                      "# TYPE colibri_decode_step_seconds histogram"]
            cumulative = 0
            for bound, n in zip((*map(str, STEP_BUCKETS), "+Inf"), self.step_counts):
                cumulative += n
                lines.append(f'colibri_decode_step_seconds_bucket{{le="{bound}"}} {cumulative}')
            lines += [f"colibri_decode_step_seconds_sum {self.step_seconds!r}",
                      f"colibri_decode_step_seconds_count {self.steps}"]
        return "\n".join(lines) + "\n"


def _one(name, kind, help_text, value):
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {value}"]
