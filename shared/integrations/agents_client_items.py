"""Client-side tool items of the Agents SDK (computer, local shell, shell, apply_patch,
custom tools) <-> a tool call and its ``tool`` result.

The SDK runs these tools in the agent's process and replays each as a pair of items: the
model's call (``computer_call``...) and its output (``computer_call_output``...), with the
same ``call_id``. They pair like ``function_call`` / ``function_call_output``, so they map
the same way: the call becomes a :class:`~shared.core.messages.ToolCall` on the model
turn's assistant message (name: the SDK tool's, arguments: the call's payload as a JSON
object), the output a ``tool`` message whose content is what the model read (a
screenshot as an image part, shell output as text). Truncation and tool-pair repair then
treat them as any call and result.

Each item is kept in the message's metadata and sent back as it came, without the bulk
that the message already holds: a call's payload is read back from its arguments, an
output's ``output`` from the message's content where that gives it back exactly (a
screenshot is stored once, not twice). A result the guard changed (a cleared, clipped or
media-omitted output, a placeholder for a missing result) is rebuilt as a valid item of
its call's type: a screenshot gone becomes a 1x1 placeholder image (a
``computer_call_output`` must carry one), shell output becomes one stdout chunk.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from shared.core.errors import InvalidInput
from shared.core.messages import FilePart, ImagePart, Message, ToolCall
from shared.integrations.agents_parts import (
    IMAGE_FILE,
    input_parts,
    json_copy,
    kind_of,
    parts_out,
    string,
)

CALL_OUTPUT = {"computer_call": "computer_call_output",
               "local_shell_call": "local_shell_call_output",
               "shell_call": "shell_call_output",
               "custom_tool_call": "custom_tool_call_output",
               "apply_patch_call": "apply_patch_call_output"}
OUTPUT_CALL = {output: call for call, output in CALL_OUTPUT.items()}
CLIENT_CALLS = "agents_client_calls"  # assistant metadata: {str(tool call index): call item}
CLIENT_ITEM = "agents_item"  # tool message metadata: the output item
FROM_ARGUMENTS = "<agents: the tool call's arguments>"  # a stored call's payload, left out
FROM_CONTENT = "<agents: the message content>"  # a stored output's output, left out
# the SDK's tool names (a custom tool call names its own)
NAMES = {"computer_call": "computer_use_preview", "local_shell_call": "local_shell",
         "shell_call": "shell", "apply_patch_call": "apply_patch"}
# the payload of a call: one object field that is the arguments, or fields that are theirs
WHOLE = {"local_shell_call": "action", "shell_call": "action", "apply_patch_call": "operation"}
FIELDS = {"computer_call": ("action", "actions"), "custom_tool_call": ("input",)}
# what a computer_call_output carries when its screenshot was cleared or omitted
PLACEHOLDER_PNG = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4"
                   "nGP4//8/AAX+Av4N70a4AAAAAElFTkSuQmCC")  # 1x1 white

__all__ = ["CALL_OUTPUT", "CLIENT_CALLS", "CLIENT_ITEM", "OUTPUT_CALL", "call_item",
           "output_item", "read_call", "read_output", "stored_output"]


# -- items -> messages ---------------------------------------------------------------------
def read_call(item: Mapping[str, Any], where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The tool call of a client call item and the item to keep (payload left out)."""
    kind = str(item["type"])
    call_id = string(item, "call_id", where, nonempty=True)
    stored: dict[str, Any] = json_copy(dict(item))
    if kind in WHOLE:
        key = WHOLE[kind]
        if not isinstance(stored.get(key), dict):
            raise InvalidInput("required" if key not in item else
                               f"expected an object, got {kind_of(item.get(key))}",
                               field=f"{where}.{key}")
        args: dict[str, Any] = stored[key]
        stored[key] = FROM_ARGUMENTS
    else:
        if kind == "custom_tool_call":
            string(item, "input", where)
        args = {}
        for key in FIELDS[kind]:
            if key in stored:
                args[key], stored[key] = stored[key], FROM_ARGUMENTS
    name = string(item, "name", where, nonempty=True) if kind == "custom_tool_call" \
        else NAMES[kind]
    return {"id": call_id, "name": name,
            "arguments": json.dumps(args, ensure_ascii=False)}, stored


def _shell_text(output: Any, where: str) -> str:
    """A shell_call_output's chunks as the model reads them: stdout, stderr, the outcome."""
    if not isinstance(output, list):
        raise InvalidInput(f"expected a list of output chunks, got {kind_of(output)}",
                           field=where)
    texts: list[str] = []
    for j, chunk in enumerate(output):
        if not isinstance(chunk, Mapping):
            raise InvalidInput(f"expected an object, got {kind_of(chunk)}", field=f"{where}[{j}]")
        lines = [str(chunk.get("stdout") or "")]
        if chunk.get("stderr"):
            lines.append(f"stderr:\n{chunk['stderr']}")
        outcome = chunk.get("outcome")
        code = outcome.get("exit_code") if isinstance(outcome, Mapping) else None
        if isinstance(code, int) and not isinstance(code, bool):
            lines.append(f"[exit code {code}]")
        elif isinstance(outcome, Mapping) and outcome.get("type") == "timeout":
            lines.append("[timed out]")
        texts.append("\n".join(line for line in lines if line))
    return "\n".join(texts)


def _content(kind: str, item: Mapping[str, Any], where: str) -> str | list[dict[str, Any]]:
    """What the model reads of an output item, as message content."""
    output = item.get("output")
    at = f"{where}.output"
    if kind == "computer_call_output":
        if not isinstance(output, Mapping):
            raise InvalidInput("required" if "output" not in item else
                               f"expected a screenshot object, got {kind_of(output)}", field=at)
        url, file_id = output.get("image_url"), output.get("file_id")
        if isinstance(url, str) and url:
            return input_parts([{"type": "input_image", "image_url": url}], at)
        if isinstance(file_id, str) and file_id:
            return input_parts([{"type": "input_image", "file_id": file_id}], at)
        return ""  # the SDK's output when the computer returned no screenshot
    if kind == "local_shell_call_output":
        return string(item, "output", where)
    if kind == "shell_call_output":
        return _shell_text(output, at)
    if kind == "apply_patch_call_output":
        status = string(item, "status", where)
        return string(item, "output", where) if "output" in item else f"apply_patch {status}"
    return input_parts(output, at)  # custom_tool_call_output: a string or input parts


def read_output(item: Mapping[str, Any], where: str, call_ids: Mapping[str, str],
                ) -> tuple[str | list[dict[str, Any]], str]:
    """The content of a client output item and the call id it answers. A
    ``local_shell_call_output`` may name its call by ``id`` (the API's shape) instead of
    ``call_id`` (the SDK's): the call's item id resolves through ``call_ids`` (item id ->
    call id, calls of the same batch), else it is taken as the call id."""
    kind = str(item["type"])
    if kind == "local_shell_call_output" and "call_id" not in item:
        ref = string(item, "id", where, nonempty=True)
        call_id = call_ids.get(ref, ref)
    else:
        call_id = string(item, "call_id", where, nonempty=True)
    return _content(kind, item, where), call_id


def stored_output(item: Mapping[str, Any], message: Message) -> dict[str, Any]:
    """The output item to keep with ``message``: its ``output`` left out when the
    message's content gives it back exactly (:func:`output_item`)."""
    stored: dict[str, Any] = json_copy(dict(item))
    if "output" in stored and _output(stored["type"], message, stored) == stored["output"]:
        stored["output"] = FROM_CONTENT
    return stored


# -- messages -> items ---------------------------------------------------------------------
def call_item(stored: Mapping[str, Any], call: ToolCall, call_id: str) -> dict[str, Any]:
    """The call item of ``stored`` with its payload from ``call``'s arguments and
    ``call_id`` (the provider's id; repair may have renamed a repeated one)."""
    args = call.args()
    kind = stored.get("type")
    out: dict[str, Any] = {}
    for key, value in stored.items():
        if value != FROM_ARGUMENTS:
            out[key] = value
        elif kind in WHOLE:
            out[key] = args
        elif isinstance(args, dict) and key in args:
            out[key] = args[key]
    out["call_id"] = call_id
    return out


def _screenshot(message: Message) -> dict[str, Any]:
    """A ``computer_screenshot`` of the message's image; a placeholder image once the
    guard replaced it by text (cleared, omitted), which a screenshot output cannot carry."""
    content = message.content
    if content == "":
        return {"type": "computer_screenshot", "image_url": ""}
    for part in content if isinstance(content, list) else []:
        if isinstance(part, ImagePart):
            return {"type": "computer_screenshot",
                    "image_url": part.url or f"data:{part.media_type};base64,{part.data}"}
        if isinstance(part, FilePart) and part.file_id and part.media_type == IMAGE_FILE:
            return {"type": "computer_screenshot", "file_id": part.file_id}
    return {"type": "computer_screenshot", "image_url": PLACEHOLDER_PNG}


def _output(kind: str, message: Message, stored: Mapping[str, Any] | None) -> Any:
    """An output item's ``output`` from the message's content."""
    if kind == "computer_call_output":
        return _screenshot(message)
    if kind == "custom_tool_call_output":
        return parts_out(message.content)
    if kind == "shell_call_output":
        chunks = stored.get("output") if stored is not None else None
        last = chunks[-1] if isinstance(chunks, list) and chunks else None
        outcome = last.get("outcome") if isinstance(last, Mapping) else None
        return [{"stdout": message.text(), "stderr": "",
                 "outcome": outcome or {"type": "exit", "exit_code": 0}}]
    return message.text()  # local shell, apply_patch


def _unchanged(kind: str, stored: Mapping[str, Any], message: Message) -> bool:
    """Whether ``message`` still holds what the stored output item gives the model."""
    try:
        content = _content(kind, stored, "item")
        return Message(role="tool", content=content, tool_call_id="x").content == message.content
    except (InvalidInput, ValueError):
        return False


def output_item(stored: Mapping[str, Any] | None, message: Message, call_kind: str | None,
                call_id: str, call_item_ids: Mapping[str, str]) -> dict[str, Any]:
    """The output item for a ``tool`` message answering a client call: the stored item as
    it came while the message holds what it read, else rebuilt from the message as its
    call's type requires (``call_kind``: the call's item type, when the call was seen).
    ``call_item_ids``: item id -> call id of the calls seen (a local shell output that
    names its call by ``id`` keeps it)."""
    kind = CALL_OUTPUT.get(call_kind or "") or str((stored or {}).get("type"))
    item: dict[str, Any]
    if stored is not None and stored.get("type") == kind:
        item = dict(stored)
        if item.get("output") == FROM_CONTENT:
            item["output"] = _output(kind, message, stored)
        elif not _unchanged(kind, stored, message):
            item["output"] = _output(kind, message, stored)
            item.pop("shell_output", None)  # the SDK's copy of the old chunks
    else:
        item = {"type": kind, "call_id": call_id, "output": _output(kind, message, None)}
        if kind == "apply_patch_call_output":
            item["status"] = "completed"
    if kind == "local_shell_call_output" and "call_id" not in item:
        ref = item.get("id")
        if ref != call_id and call_item_ids.get(str(ref)) != call_id:
            item["id"] = call_id
    else:
        item["call_id"] = call_id
    return item
