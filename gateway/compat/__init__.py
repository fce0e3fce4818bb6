"""OpenAI- and Anthropic-compatible routes over the session tree.

A stateless request (the whole conversation, resent every turn) is translated into a
`Conversation` of native messages (`openai_mapping`, `anthropic_mapping`), placed in the tenant's
session trees by content path hashes (`placement`, over `sessions.path_index`), and only the
messages after the deepest matching turn are appended through the native `TurnService`
(`runner`), so the engine computes only the delta. `openai_routes` and `anthropic_routes` format
the turn's events in each API's exact wire shapes; `models_route` serves `GET /v1/models`.
"""
