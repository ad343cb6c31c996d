"""The target's tool calls, read from its answers with vLLM's own tool parser (ToolCalls)."""

from __future__ import annotations

import json


class ToolCalls:
    """The target's tool calls read from its answer with vLLM's own tool parser
    (`regenerate.tool_call_parser`, vLLM's `--tool-call-parser`), as its chat API reads them;
    built when a row with tools is first answered."""

    def __init__(self, parser: str, tokenizer):
        self.name, self.tokenizer, self._parser, self._requests = parser, tokenizer, None, {}

    def parser(self):
        if self._parser is None:
            from vllm.tool_parsers import ToolParserManager

            try:
                self._parser = ToolParserManager.get_tool_parser(self.name)(self.tokenizer)
            except KeyError:
                raise ValueError(
                    f"regenerate.tool_call_parser is {self.name!r}, not one of vLLM's tool parsers "
                    f"({', '.join(ToolParserManager.list_registered())}); set the one the target is served with"
                ) from None
        return self._parser

    def request(self, tools: list[dict]):
        """The chat request vLLM's server would build for these tools, as the parser adjusts it."""
        key = json.dumps(tools, sort_keys=True)
        if key not in self._requests:
            from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

            self._requests[key] = self.parser().adjust_request(ChatCompletionRequest(messages=[], tools=tools))
        return self._requests[key]

    def sampling(self, tools: list[dict] | None) -> dict:
        """SamplingParams the parser needs (e.g. special tokens kept: some targets' call tags are special)."""
        return {"skip_special_tokens": self.request(tools).skip_special_tokens} if tools else {}

    def parse(self, text: str, tools: list[dict]) -> tuple[str, list[dict]] | None:
        """(content, calls) of an answer that calls tools, None for a plain answer."""
        info = self.parser().extract_tool_calls(text, self.request(tools))
        if not info.tools_called or not info.tool_calls:
            return None
        calls = []
        for call in info.tool_calls:
            try:
                arguments = json.loads(call.function.arguments or "{}")
            except json.JSONDecodeError:
                return None  # not a call a template can render back: kept as the text it is
            if not isinstance(arguments, dict):
                return None
            calls.append({"type": "function", "function": {"name": call.function.name, "arguments": arguments}})
        return info.content or "", calls
