/* Prints the size and field offsets of every public struct the Python
 * binding mirrors with ctypes, as JSON: test_python_package.py compares
 * them with ctypes.sizeof / Structure field offsets, so a field added to a
 * C header without the binding fails a test instead of corrupting memory. */
#include <stddef.h>
#include <stdio.h>
#include "deltacast/consumer.h"
#include "deltacast/producer.h"

#define FIELD(T, f) printf("%s\"%s\": %zu", first ? "" : ", ", #f, offsetof(T, f)), first = 0
#define BEGIN(T, name) do { int first = 1; printf("%s\"%s\": {\"size\": %zu, \"fields\": {", \
			  sep, name, sizeof(T)); sep = ", ";
#define END() printf("}}"); } while (0)

int main(void)
{
	const char *sep = "";

	printf("{");
	BEGIN(dcast_consumer_opts, "consumer_opts");
	FIELD(dcast_consumer_opts, verify_digests); FIELD(dcast_consumer_opts, heartbeat_ms);
	FIELD(dcast_consumer_opts, fold_every); FIELD(dcast_consumer_opts, max_staged);
	FIELD(dcast_consumer_opts, client); FIELD(dcast_consumer_opts, curve_server_key);
	FIELD(dcast_consumer_opts, curve_public_key); FIELD(dcast_consumer_opts, curve_secret_key);
	FIELD(dcast_consumer_opts, fold_fraction); FIELD(dcast_consumer_opts, auto_apply);
	FIELD(dcast_consumer_opts, commit_timeout_ms); FIELD(dcast_consumer_opts, bulk);
	END();
	BEGIN(dcast_event, "event");
	FIELD(dcast_event, type); FIELD(dcast_event, version); FIELD(dcast_event, have_version);
	FIELD(dcast_event, code); FIELD(dcast_event, bytes); FIELD(dcast_event, text);
	END();
	BEGIN(dcast_tensor_desc, "tensor_desc");
	FIELD(dcast_tensor_desc, name); FIELD(dcast_tensor_desc, dtype);
	FIELD(dcast_tensor_desc, ndim); FIELD(dcast_tensor_desc, shape); FIELD(dcast_tensor_desc, grid);
	END();
	BEGIN(dcast_consumer_stats, "consumer_stats");
	FIELD(dcast_consumer_stats, version); FIELD(dcast_consumer_stats, anchor);
	FIELD(dcast_consumer_stats, chunks); FIELD(dcast_consumer_stats, bytes);
	FIELD(dcast_consumer_stats, stage_ns); FIELD(dcast_consumer_stats, apply_ns);
	FIELD(dcast_consumer_stats, spilled_chunks); FIELD(dcast_consumer_stats, total_bytes_received);
	FIELD(dcast_consumer_stats, peak_pool_bytes); FIELD(dcast_consumer_stats, pool_bytes);
	FIELD(dcast_consumer_stats, log_write_bytes); FIELD(dcast_consumer_stats, log_write_ns);
	FIELD(dcast_consumer_stats, verify_bytes); FIELD(dcast_consumer_stats, rejoins);
	FIELD(dcast_consumer_stats, folds); FIELD(dcast_consumer_stats, folding);
	FIELD(dcast_consumer_stats, folds_from_tensors); FIELD(dcast_consumer_stats, ready_backlog);
	FIELD(dcast_consumer_stats, versions_aborted); FIELD(dcast_consumer_stats, commit_timeouts);
	FIELD(dcast_consumer_stats, bulk_versions); FIELD(dcast_consumer_stats, bulk_failures);
	FIELD(dcast_consumer_stats, bulk_in_place_bytes);
	FIELD(dcast_consumer_stats, direct_write_bytes);
	END();
	BEGIN(dcast_producer_opts, "producer_opts");
	FIELD(dcast_producer_opts, range_elems); FIELD(dcast_producer_opts, max_inflight_bytes);
	FIELD(dcast_producer_opts, undo_bytes); FIELD(dcast_producer_opts, connect_timeout_ms);
	FIELD(dcast_producer_opts, ack_timeout_ms); FIELD(dcast_producer_opts, max_reconnects);
	FIELD(dcast_producer_opts, reconnect_backoff_ms); FIELD(dcast_producer_opts, baseline_on_device);
	FIELD(dcast_producer_opts, client); FIELD(dcast_producer_opts, curve_server_key);
	FIELD(dcast_producer_opts, curve_public_key); FIELD(dcast_producer_opts, curve_secret_key);
	FIELD(dcast_producer_opts, encode_threads); FIELD(dcast_producer_opts, close_timeout_ms);
	END();
	BEGIN(dcast_producer_stats, "producer_stats");
	FIELD(dcast_producer_stats, version); FIELD(dcast_producer_stats, anchor);
	FIELD(dcast_producer_stats, chunks_total); FIELD(dcast_producer_stats, chunks_sent);
	FIELD(dcast_producer_stats, changed_elems); FIELD(dcast_producer_stats, elems);
	FIELD(dcast_producer_stats, payload_bytes); FIELD(dcast_producer_stats, model_bytes);
	FIELD(dcast_producer_stats, acked_version); FIELD(dcast_producer_stats, total_reconnects);
	FIELD(dcast_producer_stats, total_payload_bytes); FIELD(dcast_producer_stats, total_resends);
	FIELD(dcast_producer_stats, baseline_version); FIELD(dcast_producer_stats, broker_version);
	FIELD(dcast_producer_stats, failed_version); FIELD(dcast_producer_stats, failed_err);
	END();
	BEGIN(dcast_producer_progress, "producer_progress");
	FIELD(dcast_producer_progress, version); FIELD(dcast_producer_progress, active);
	FIELD(dcast_producer_progress, anchor); FIELD(dcast_producer_progress, ranges_done);
	FIELD(dcast_producer_progress, ranges_total); FIELD(dcast_producer_progress, bytes_sent);
	FIELD(dcast_producer_progress, bytes_taken); FIELD(dcast_producer_progress, bytes_total);
	FIELD(dcast_producer_progress, elapsed_ms); FIELD(dcast_producer_progress, err);
	END();
	printf("}\n");
	return 0;
}
