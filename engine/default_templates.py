"""Chat formats for models whose files carry no chat template: the family's own turn format,
used only where the file has none (and logged by the loader).

Gemma's is its published one (`<start_of_turn>user` / `<start_of_turn>model` turns closed by
`<end_of_turn>`); it has no system role, so a leading system message opens the first user turn,
and other roles (tool results) are user turns. It only appends, as per-turn rendering needs.
"""

from __future__ import annotations

GEMMA = (
    "{{ bos_token }}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] ~ '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = '' -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else 'user' -%}"
    "{{ '<start_of_turn>' ~ role ~ '\n' }}"
    "{{- (first_user_prefix if loop.first and role == 'user' else '')"
    " ~ message['content'] | trim }}"
    "{{- '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)

# GGUF `general.architecture` -> (family name for logs, template)
BY_ARCHITECTURE = dict.fromkeys(("gemma", "gemma2", "gemma3"), ("Gemma", GEMMA))
