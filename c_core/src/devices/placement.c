/* SPDX-License-Identifier: MIT */
/* The devices' public entries (colibri/device.h): names, placement (by entry, table or file), the
 * statistics. */
#include <string.h>

#include "devices.h"
#include "../runtime/session.h"
#include "../model/json.h"
#include "../util.h"

int32_t colibri_device_count(const colibri_session *s)
{
    return !s ? 0 : s->devices ? s->devices->n : 1;
}

const char *colibri_device_name(const colibri_session *s, int32_t device)
{
    if (!s || device < 0 || device >= colibri_device_count(s)) return NULL;
    return device == 0 ? "cpu" : s->devices->dev[device].driver->name;
}

int32_t colibri_device_find(const colibri_session *s, const char *name)
{
    int32_t i;
    for (i = 0; name && i < colibri_device_count(s); i++)
        if (!strcmp(colibri_device_name(s, i), name)) return i;
    return -1;
}

/* Checks every entry of `placement` (MoE layers only) before anything changes. */
static colibri_status check_table(const colibri_session *s, const uint8_t *placement, colibri_error *err)
{
    const colibri_devices *d = s->devices;
    int32_t l, e;
    for (l = 0; l < d->n_layers; l++) {
        if (!s->model->layers[l].moe) continue;
        for (e = 0; e < d->n_experts; e++) {
            colibri_status st = colibri_device_can_place(d, s->model, l, e, placement[(size_t)l * d->n_experts + e], err);
            if (st) return st;
        }
    }
    return COLIBRI_OK;
}

static colibri_status need_devices(const colibri_session *s, const char *call, colibri_error *err)
{
    if (!s) return colibri_fail(err, COLIBRI_E_ARG, "%s: NULL session", call);
    if (!s->devices) return colibri_fail(err, COLIBRI_E_ARG, "%s: the session has no drivers beside the cpu", call);
    return COLIBRI_OK;
}

colibri_status colibri_place(colibri_session *s, int32_t layer, int32_t expert, int32_t device, colibri_error *err)
{
    colibri_devices *d;
    int32_t l, e;
    colibri_status st = need_devices(s, "colibri_place", err);
    if (st) return st;
    d = s->devices;
    if (layer < -1 || layer >= d->n_layers || expert < -1 || expert >= d->n_experts)
        return colibri_fail(err, COLIBRI_E_ARG, "colibri_place: layer %d expert %d out of range (%d layers, %d experts)",
                            layer, expert, d->n_layers, d->n_experts);
    if (layer >= 0 && !s->model->layers[layer].moe)
        return colibri_fail(err, COLIBRI_E_ARG, "colibri_place: layer %d is dense: it has no routed experts", layer);
    for (l = 0; l < d->n_layers; l++)   /* checked first: nothing changes on error */
        for (e = 0; e < d->n_experts; e++)
            if ((layer < 0 || l == layer) && (expert < 0 || e == expert) && s->model->layers[l].moe
                && (st = colibri_device_can_place(d, s->model, l, e, device, err)) != COLIBRI_OK)
                return st;
    for (l = 0; l < d->n_layers; l++)
        for (e = 0; e < d->n_experts; e++)
            if ((layer < 0 || l == layer) && (expert < 0 || e == expert) && s->model->layers[l].moe)
                d->placement[(size_t)l * d->n_experts + e] = (uint8_t)device;
    return COLIBRI_OK;
}

colibri_status colibri_placement_set(colibri_session *s, const uint8_t *placement, colibri_error *err)
{
    colibri_devices *d;
    int32_t l;
    colibri_status st = need_devices(s, "colibri_placement_set", err);
    if (st) return st;
    if (!placement) return colibri_fail(err, COLIBRI_E_ARG, "colibri_placement_set: NULL placement");
    d = s->devices;
    if ((st = check_table(s, placement, err)) != COLIBRI_OK) return st;
    for (l = 0; l < d->n_layers; l++)   /* dense layers keep 0 */
        if (s->model->layers[l].moe)
            memcpy(d->placement + (size_t)l * d->n_experts, placement + (size_t)l * d->n_experts, (size_t)d->n_experts);
    return COLIBRI_OK;
}

void colibri_placement_get(const colibri_session *s, uint8_t *placement)
{
    const colibri_hparams *hp;
    if (!s || !placement) return;
    hp = &s->model->hp;
    if (s->devices) memcpy(placement, s->devices->placement, (size_t)hp->n_layers * hp->n_experts);
    else memset(placement, 0, (size_t)hp->n_layers * hp->n_experts);
}

/* ---- placement files ---- */

colibri_status colibri_placement_scratch_bytes(const colibri_session *s, const char *json, size_t len, size_t *bytes,
                                               colibri_error *err)
{
    uint32_t n = 0;
    colibri_status st;
    if (!s || !json || !bytes) return colibri_fail(err, COLIBRI_E_ARG, "colibri_placement_scratch_bytes: NULL argument");
    st = colibri_json_parse(json, len, NULL, 0, &n, err);
    if (st) {   /* the reader names the model's file: this is a placement's */
        char detail[COLIBRI_ERROR_MESSAGE_SIZE];
        const char *at = err ? strstr(err->message, "line ") : NULL;
        if (!at) return st;
        memcpy(detail, at, strlen(at) + 1);
        return colibri_fail(err, st, "placement: %s", detail);
    }
    *bytes = (size_t)n * sizeof(json_token) + (size_t)s->model->hp.n_layers * s->model->hp.n_experts;
    return COLIBRI_OK;
}

/* A key for a message: at most 31 bytes of it. */
static const char *key_text(const char *text, const json_token *t, char buf[32])
{
    size_t n = t->len < 31 ? t->len : 31;
    memcpy(buf, text + t->start, n);
    buf[n] = '\0';
    return buf;
}

/* A device named by the string token t, or COLIBRI_E_VALUE naming the devices there are. */
static colibri_status device_named(const colibri_session *s, const char *text, const json_token *t, const char *where,
                                   int32_t *device, colibri_error *err)
{
    char name[16];
    if (t->type != JSON_STRING) return colibri_fail(err, COLIBRI_E_TYPE, "placement %s: a device name (string)", where);
    if (t->len >= sizeof name)
        return colibri_fail(err, COLIBRI_E_VALUE, "placement %s: device name longer than 15 characters", where);
    memcpy(name, text + t->start, t->len);
    name[t->len] = '\0';
    *device = colibri_device_find(s, name);
    if (*device < 0) {
        char list[96];
        size_t used = 0;
        int32_t i;
        for (i = 0; i < colibri_device_count(s) && used < sizeof list; i++)   /* truncated past 95 bytes */
            used += colibri_format(list + used, sizeof list - used, "%s%s", i ? ", " : "", colibri_device_name(s, i));
        return colibri_fail(err, COLIBRI_E_VALUE, "placement %s: no device \"%s\" in this session (it has: %s)", where, name,
                            list);
    }
    return COLIBRI_OK;
}

/* An index field: an integer in [0, limit), or "all" (-1). */
static colibri_status index_or_all(const char *text, const json_token *t, int32_t limit, const char *what,
                                   const char *where, int32_t *value, colibri_error *err)
{
    int64_t v;
    if (t->type == JSON_STRING && colibri_json_string_equals(text, t, "all")) { *value = -1; return COLIBRI_OK; }
    if (!colibri_json_as_int64(text, t, &v)) return colibri_fail(err, COLIBRI_E_TYPE, "placement %s: %s must be an integer or \"all\"", where, what);
    if (v < 0 || v >= limit) return colibri_fail(err, COLIBRI_E_VALUE, "placement %s: %s %lld out of range [0, %d)", where, what, (long long)v, limit);
    *value = (int32_t)v;
    return COLIBRI_OK;
}

/* table[l, e] = device for the (layer, expert) pairs entry `at` names. */
static colibri_status apply_entry(const colibri_session *s, const char *text, const json_token *tok, int32_t at,
                                  int32_t index, uint8_t *table, colibri_error *err)
{
    const colibri_hparams *hp = &s->model->hp;
    int32_t device, layer, l, e, key, list = -1;
    uint32_t i;
    char where[32], key_buf[32];
    colibri_status st;
    colibri_format(where, sizeof where, "experts[%d]", index);
    if (tok[at].type != JSON_OBJECT) return colibri_fail(err, COLIBRI_E_TYPE, "placement %s: an object", where);
    for (i = 0, key = at + 1; i < tok[at].n_children; i++, key += 1 + (int32_t)tok[key + 1].subtree) {
        if (!colibri_json_string_equals(text, &tok[key], "device") && !colibri_json_string_equals(text, &tok[key], "layer")
            && !colibri_json_string_equals(text, &tok[key], "experts"))
            return colibri_fail(err, COLIBRI_E_VALUE, "placement %s: unknown field \"%s\" (device, layer, experts)", where,
                                key_text(text, &tok[key], key_buf));
    }
    if (colibri_json_object_get(text, tok, at, "device") < 0 || colibri_json_object_get(text, tok, at, "layer") < 0
        || (list = colibri_json_object_get(text, tok, at, "experts")) < 0)
        return colibri_fail(err, COLIBRI_E_MISSING, "placement %s: needs device, layer and experts", where);
    if ((st = device_named(s, text, &tok[colibri_json_object_get(text, tok, at, "device")], where, &device, err)) != COLIBRI_OK) return st;
    if ((st = index_or_all(text, &tok[colibri_json_object_get(text, tok, at, "layer")], hp->n_layers, "layer", where, &layer, err)) != COLIBRI_OK)
        return st;
    if (layer >= 0 && !s->model->layers[layer].moe)
        return colibri_fail(err, COLIBRI_E_VALUE, "placement %s: layer %d is dense: it has no routed experts", where, layer);
    for (l = 0; l < hp->n_layers; l++) {
        int32_t item;
        if ((layer >= 0 && l != layer) || !s->model->layers[l].moe) continue;
        if (tok[list].type == JSON_STRING) {
            if (!colibri_json_string_equals(text, &tok[list], "all"))
                return colibri_fail(err, COLIBRI_E_VALUE, "placement %s: experts must be a list of ids or \"all\"", where);
            memset(table + (size_t)l * hp->n_experts, device, (size_t)hp->n_experts);
            continue;
        }
        if (tok[list].type != JSON_ARRAY)
            return colibri_fail(err, COLIBRI_E_TYPE, "placement %s: experts must be a list of ids or \"all\"", where);
        for (i = 0, item = list + 1; i < tok[list].n_children; i++, item += (int32_t)tok[item].subtree) {
            if ((st = index_or_all(text, &tok[item], hp->n_experts, "expert", where, &e, err)) != COLIBRI_OK) return st;
            if (e < 0) return colibri_fail(err, COLIBRI_E_VALUE, "placement %s: \"all\" inside a list", where);
            table[(size_t)l * hp->n_experts + e] = (uint8_t)device;
        }
    }
    return COLIBRI_OK;
}

colibri_status colibri_placement_parse(colibri_session *s, const char *json, size_t len, void *scratch,
                                       size_t scratch_bytes, colibri_error *err)
{
    const colibri_hparams *hp;
    json_token *tok = scratch;
    uint8_t *table;
    uint32_t n = 0, i;
    int32_t v, list, item, key, device = 0;
    int64_t version;
    char key_buf[32];
    size_t need;
    colibri_status st;
    if (!s) return colibri_fail(err, COLIBRI_E_ARG, "colibri_placement_parse: NULL session");
    hp = &s->model->hp;
    if ((st = colibri_placement_scratch_bytes(s, json, len, &need, err)) != COLIBRI_OK) return st;
    if (!scratch || (uintptr_t)scratch % 4 || scratch_bytes < need)
        return colibri_fail(err, COLIBRI_E_ARG, "colibri_placement_parse: scratch must be 4-byte aligned and %zu bytes", need);
    if ((st = colibri_json_parse(json, len, tok, (uint32_t)((need - (size_t)hp->n_layers * hp->n_experts) / sizeof(json_token)), &n, err)))
        return st;
    table = (uint8_t *)scratch + (size_t)n * sizeof(json_token);
    if (tok[0].type != JSON_OBJECT) return colibri_fail(err, COLIBRI_E_TYPE, "placement: the file must be a JSON object");
    for (i = 0, key = 1; i < tok[0].n_children; i++, key += 1 + (int32_t)tok[key + 1].subtree)
        if (!colibri_json_string_equals(json, &tok[key], "format") && !colibri_json_string_equals(json, &tok[key], "version")
            && !colibri_json_string_equals(json, &tok[key], "default") && !colibri_json_string_equals(json, &tok[key], "experts"))
            return colibri_fail(err, COLIBRI_E_VALUE, "placement: unknown field \"%s\" (format, version, default, experts)",
                                key_text(json, &tok[key], key_buf));
    v = colibri_json_object_get(json, tok, 0, "format");
    if (v < 0 || !colibri_json_string_equals(json, &tok[v], "colibri-placement"))
        return colibri_fail(err, COLIBRI_E_VERSION, "placement: \"format\" must be \"colibri-placement\"");
    v = colibri_json_object_get(json, tok, 0, "version");
    if (v < 0 || !colibri_json_as_int64(json, &tok[v], &version) || version != 1)
        return colibri_fail(err, COLIBRI_E_VERSION, "placement: \"version\" must be 1");
    v = colibri_json_object_get(json, tok, 0, "default");
    if (v >= 0 && (st = device_named(s, json, &tok[v], "default", &device, err)) != COLIBRI_OK) return st;
    memset(table, 0, (size_t)hp->n_layers * hp->n_experts);
    for (v = 0; v < hp->n_layers; v++)
        if (s->model->layers[v].moe) memset(table + (size_t)v * hp->n_experts, device, (size_t)hp->n_experts);
    list = colibri_json_object_get(json, tok, 0, "experts");
    if (list >= 0) {
        if (tok[list].type != JSON_ARRAY) return colibri_fail(err, COLIBRI_E_TYPE, "placement: \"experts\" must be a list");
        for (i = 0, item = list + 1; i < tok[list].n_children; i++, item += (int32_t)tok[item].subtree)
            if ((st = apply_entry(s, json, tok, item, (int32_t)i, table, err)) != COLIBRI_OK) return st;
    }
    return s->devices ? colibri_placement_set(s, table, err) : COLIBRI_OK;   /* no drivers: every name was "cpu" */
}

/* ---- statistics ---- */

colibri_status colibri_device_stats_get(const colibri_session *s, int32_t device, colibri_device_stats *stats)
{
    if (!s || !stats || device < 0 || device >= colibri_device_count(s)) return COLIBRI_E_ARG;
    if (!s->devices) { memset(stats, 0, sizeof *stats); return COLIBRI_OK; }
    *stats = s->devices->dev[device].stats;
    return COLIBRI_OK;
}

void colibri_device_stats_clear(colibri_session *s)
{
    int32_t i;
    if (!s || !s->devices) return;
    for (i = 0; i < s->devices->n; i++) {   /* the counters; the ring and the bypass state stay */
        colibri_device_stats *st = &s->devices->dev[i].stats;
        st->calls = st->experts = st->rows = st->errors = st->slow = st->fallbacks = st->probes = st->bypassed = 0;
    }
}
