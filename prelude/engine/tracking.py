"""Engine-side state of one admitted request, and how a row result advances it: the new tokens
and text it yields, and whether the request is done. This is the one place a request's normal
end (stop token, EOS, stop string, length, OneShot result) is decided; aborts and errors come
from outside the step and end requests through the same InFlight.finish."""
from __future__ import annotations

from dataclasses import dataclass

from prelude.contract.batch import RowResult
from prelude.engine.detokenize import IncrementalDetokenizer
from prelude.engine.output import FinishReason, RequestMetrics, RequestOutput, RequestStream
from prelude.engine.request import Task
from prelude.engine.work import OneShotJob, Sequence, Work
from prelude.tokenizer import Tokenizer


@dataclass(slots=True)
class Tracked:
    work: Work
    stream: RequestStream
    detokenizer: IncrementalDetokenizer | None = None  # requests that generate tokens
    first_token_time: float | None = None
    last_token_time: float | None = None  # for the gap to its next token (inter-token latency)
    mixed: bool = False  # its prompt finished in a step beside other requests' decodes

    @classmethod
    def admit(cls, work: Work, tokenizer: Tokenizer) -> Tracked:
        request = work.request
        detokenizer = None
        # A one-token (OneShot) answer goes through the detokenizer too: it applies the stop
        # strings, and decodes the token after the prompt's last tokens, as a longer answer's
        # first token is (decoded alone, a SentencePiece token loses its leading space).
        if request.generates:
            detokenizer = IncrementalDetokenizer(tokenizer, request.prompt_ids, request.sampling.stop,
                                                 request.sampling.skip_special_tokens,
                                                 request.sampling.include_stop_str_in_output)
        return cls(work, RequestStream(request.request_id, work.seq_id), detokenizer)

    def metrics(self, now: float) -> RequestMetrics:
        """Its execution class and latencies, reported with its last output."""
        work, first = self.work, self.first_token_time
        arrival = work.request.arrival_time
        kind = "Mixed" if self.mixed else "OneShot" if isinstance(work, OneShotJob) else "Decode"
        return RequestMetrics(kind, (work.first_scheduled or now) - arrival,
                              None if first is None else first - arrival)


def advance(tracked: Tracked, result: RowResult,
            eos_token_ids: frozenset[int]) -> tuple[RequestOutput, FinishReason | None]:
    """The increment one row's result adds to its request, and the reason it ends, if it does."""
    work, request = tracked.work, tracked.work.request
    sampling = request.sampling
    out = RequestOutput(request.request_id, prompt_logprobs=result.prompt_logprobs, pooled=result.pooled,
                        scores=result.scores, label_logprobs=result.label_logprobs,
                        item_label_logprobs=result.item_label_logprobs,
                        num_prompt_tokens=request.num_prompt_tokens, num_cached_tokens=work.num_cached_tokens)
    token = result.token
    reason: FinishReason | None = None
    stop_reason: str | int | None = None
    detok = tracked.detokenizer
    if token is not None and sampling.logprobs is not None:
        out.logprobs = [token]
    # A sequence holds its answer so far; a OneShot job's answer is this output's tokens.
    seq = work if isinstance(work, Sequence) else None
    before = 0 if seq is None else seq.num_output_tokens
    new_ids = out.token_ids
    # The sampled token, then those its grammar forced (a stop ends the answer at the first).
    for token_id in (token.token_id, *result.forced) if token is not None else ():
        if seq is not None:
            seq.token_ids.append(token_id)
        new_ids.append(token_id)
        if sampling.ends_at(token_id, eos_token_ids):
            reason = FinishReason.STOP
            stop_reason = token_id if token_id in sampling.stop_token_ids else None
        # A token that ended the request (stop_token_ids, EOS) is in the text only when the request
        # keeps what stopped it, as vLLM's include_stop_str_in_output does for stop tokens too.
        if detok is not None and (reason is None or sampling.include_stop_str_in_output):
            hit = detok.add(token_id, stops_armed=before + len(new_ids) > sampling.min_tokens)
            if hit is not None and reason is None:
                reason, stop_reason = FinishReason.STOP, hit
        if reason is not None:
            break
    out.num_output_tokens = before + len(new_ids)
    if reason is None and sampling.one_token_answer and new_ids:
        reason = FinishReason.STOP
    elif reason is None and not request.generates:
        # Pooling, classification and label scores end stopped, as vLLM's pooling requests (its
        # finished_reason metric counted every embedding as "length"); prompt logprobs with
        # max_tokens 0 reached their length.
        reason = FinishReason.LENGTH if request.task is Task.GENERATE else FinishReason.STOP
    elif reason is None and out.num_output_tokens >= sampling.max_tokens:
        reason = FinishReason.LENGTH
    if detok is not None:
        if reason is not None and not isinstance(stop_reason, str):  # not cut at a stop string
            hit = detok.finish()  # the text held while it ended inside a character
            if hit is not None:
                reason, stop_reason = FinishReason.STOP, hit
        out.text = detok.emit(final=reason is not None)
    if reason is not None:
        out.finished, out.finish_reason, out.stop_reason = True, reason, stop_reason
    return out, reason
