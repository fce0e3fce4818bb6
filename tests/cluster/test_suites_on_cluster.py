"""The session, gateway and compat suites, run again on the cluster (see conftest.py).

Every test imported here ran first on one server; here each Lua script must find its keys in one
slot (CROSSSLOT otherwise), cross-slot pipelines go through the cluster client, and the gateway
acknowledges mutations after WAIT. Left out: the tests that build a plain `Redis` client
themselves (RESP2, a decode_responses client) or restart a single server.
"""

from __future__ import annotations

from tests.compat.test_openai import (  # noqa: F401
    test_errors_use_the_openai_envelope,
    test_streamed_tool_call_deltas_assemble_in_the_client,
    test_text_then_streamed_continuation_reports_cached_tokens,
)
from tests.compat.test_rate_limits import (  # noqa: F401
    test_a_dead_gateways_concurrency_slot_lapses,
    test_openai_client_gets_429_with_ratelimit_headers_before_any_store_write,
    test_tokens_are_settled_from_the_turns_usage,
)
from tests.compat.test_responses_store import test_retention_is_bounded  # noqa: F401
from tests.gateway.test_browse_api import (  # noqa: F401
    test_another_tenant_sees_none_of_it,
    test_listing_is_newest_first_searchable_and_paged,
    test_tree_pages_carry_usage_timings_and_match_the_session,
)
from tests.gateway.test_session_events import (  # noqa: F401
    base_url,
    test_event_stream_replays_then_streams_generation_and_ends_on_delete,
)
from tests.gateway.test_sessions_api import (  # noqa: F401
    test_create_append_get_fork_rewind_delete,
    test_health_and_openapi,
)
from tests.sessions.test_concurrency import (  # noqa: F401
    test_concurrent_idempotent_retries_write_once,
    test_one_of_twenty_guarded_appends_wins,
    test_twenty_unguarded_appends_form_one_chain,
)
from tests.sessions.test_idempotency import (  # noqa: F401
    test_idempotent_append_replays_first_result,
    test_idempotent_fork_rewind_and_create,
)
from tests.sessions.test_path_index import (  # noqa: F401
    test_delete_session_drops_its_index,
    test_find_the_deepest_anchor,
)
from tests.sessions.test_store import (  # noqa: F401
    test_append_chain_and_token_path,
    test_create_session_has_root_and_main,
    test_delete_removes_every_key,
    test_detached_input_then_fast_forward,
    test_events_record_each_mutation,
    test_expected_version_is_checked,
    test_fork_and_rewind_errors,
    test_new_turn_payload_round_trips,
    test_tenant_isolation,
)
from tests.sessions.test_turn_commit import (  # noqa: F401
    test_begin_checks_before_anything_runs,
    test_begin_reserves_and_commit_releases,
    test_lapsed_lease_and_moved_head_fall_back_to_a_fork,
    test_release_and_idempotent_commit,
)
