"""Hidden states asked of the running server as speculators' Trainer asks for them (request_states)."""

from __future__ import annotations

from pathlib import Path

from draftline.backends.vllm_server.server import ServerError


def request_states(endpoint: str, token_ids: dict[int, list[int]], timeout_s: float = 120.0) -> dict:
    """Each row's hidden states [seq, layers, hidden] (float32) from the running server, asked for
    as speculators' Trainer asks (`--on-missing generate`: its `generate_hidden_states`, a
    completion of the row's token ids with max_tokens=1); each file the server wrote is read once
    its writer is done, checked with speculators' `check_hidden_states` (token ids, finite values)
    and deleted, as the Trainer does."""
    import openai
    from safetensors.torch import load_file
    from speculators.data_generation.offline import check_hidden_states
    from speculators.data_generation.vllm_client import InvalidResponseError, generate_hidden_states

    from draftline.backends.vllm import _wait_for_write

    client = openai.OpenAI(base_url=endpoint, api_key="EMPTY", max_retries=0)
    model = client.models.list().data[0].id
    out = {}
    for row, ids in token_ids.items():
        try:
            path, _ = generate_hidden_states(client, model, {"input_ids": list(ids)}, timeout=timeout_s)
        except InvalidResponseError as err:  # speculators gives up on the row (its retries spent)
            raise ServerError(f"dataset row {row}: the server answered without hidden states ({err}); "
                              "its log says why") from err
        _wait_for_write(path)
        try:
            data = load_file(path)
            check_hidden_states(data, list(ids))
        except ValueError as err:
            raise ServerError(f"dataset row {row}: the server's hidden states {path} are unusable ({err})") from err
        finally:
            Path(path).unlink(missing_ok=True)
        out[row] = data["hidden_states"].float()
    return out
