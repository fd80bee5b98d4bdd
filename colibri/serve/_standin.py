"""A stand-in for colibri.Batch while the core's several-sequence API is not in this tree: one
one-sequence Session per slot, stepped in turn (Session.stream's generation and text stream), so
nothing is batched.  The scheduler uses it only when colibri has no Batch; it goes when that lands."""
import colibri


class Batch:
    def __init__(self, model, n_seq, **session_options):
        self.sessions = [model.session(**session_options) for _ in range(n_seq)]
        self.session = self.sessions[0]   # what the scheduler reads n_ctx and the expert cache's counters from
        self._runs = {}                   # seq -> (the generation's generator, its text stream)

    def start(self, seq, prompt, *, max_tokens=16, temperature=0.0, top_p=1.0, seed=None, stop=(),
              stop_at_eos=True, presence_penalty=0.0, frequency_penalty=0.0, logit_bias=None):
        text = colibri.core()._TextOut(stop)   # the core checks the stop strings here
        session = self.sessions[seq]
        session.reset()
        self._runs[seq] = (session.stream(prompt, max_tokens, temperature, 0, top_p, -1 if seed is None else seed,
                                          stop_at_eos, presence_penalty=presence_penalty,
                                          frequency_penalty=frequency_penalty, logit_bias=logit_bias, _text=text),
                           text)
        return 0

    def cancel(self, seq):
        self._runs.pop(seq)[0].close()

    def step(self):
        out = []
        for seq, (tokens, text) in list(self._runs.items()):
            token = next(tokens, None)
            finish = self.sessions[seq].stop_reason
            if finish is not None:
                del self._runs[seq]
            out.append((seq, token, text.take(), finish))
        return out
