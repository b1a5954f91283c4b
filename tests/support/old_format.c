/* tests/old_format.h: headers as older builds wrote them. */
#include <msgpack.h>
#include <string.h>
#include "../old_format.h"

static int is_sum(const msgpack_object *k)
{
	return k->type == MSGPACK_OBJECT_STR && k->via.str.size == 3 && !memcmp(k->via.str.ptr, "sum", 3);
}

static void pack_without_sum(const msgpack_object_map *map, msgpack_sbuffer *sb)
{
	msgpack_packer pk;

	msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, map->size - 1);
	for (uint32_t i = 0; i < map->size; i++) {
		if (is_sum(&map->ptr[i].key))
			continue;
		msgpack_pack_object(&pk, map->ptr[i].key);
		msgpack_pack_object(&pk, map->ptr[i].val);
	}
}

int old_without_sum(const void *hdr, size_t len, void **out, size_t *out_len)
{
	msgpack_unpacked up;
	msgpack_sbuffer sb;
	size_t off = 0;
	int found = 0;

	msgpack_unpacked_init(&up);
	if (msgpack_unpack_next(&up, hdr, len, &off) == MSGPACK_UNPACK_SUCCESS &&
	    up.data.type == MSGPACK_OBJECT_MAP)
		for (uint32_t i = 0; i < up.data.via.map.size; i++)
			found |= is_sum(&up.data.via.map.ptr[i].key);
	if (found) {
		msgpack_sbuffer_init(&sb);
		pack_without_sum(&up.data.via.map, &sb);
		*out = sb.data;
		*out_len = sb.size;
	}
	msgpack_unpacked_destroy(&up);
	return found ? 0 : -1;
}
