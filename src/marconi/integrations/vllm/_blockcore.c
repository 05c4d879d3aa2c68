/* The compiled core of BlockEvictionState: the same events, rows and victims as
 * marconi.integrations.vllm.blockcore.PyBlockCore, the pure-Python specification it is held
 * to (tests/test_vllm_block_core.py replays random event streams through both and compares every
 * victim and every row). Why it exists: the bookkeeping of one victim costs ~10 us in Python and
 * vLLM's whole LRU eviction ~1.7 us (docs/vllm-at-scale.md, "What the plugin costs the scheduler").
 *
 * Interface (both cores): BlockCore(group_is_attn: tuple[bool, ...], num_blocks: int,
 * num_variants: int, effs_of: callable(depth) -> tuple[float, ...]); methods cached, uncached,
 * released, taken, victim(alpha, variant) -> (block, reason) | None, clear, keys_of, prefix_info,
 * rows, snapshot, members, check_index; attribute reason (the live list of reason ids); len().
 *
 * Data: prefixes are interned to nodes (a dict prefix -> node id, whose entries for freed nodes go
 * stale and are dropped in batches: node_lookup). A node that holds no block but
 * still has child prefixes holding attention blocks is kept as a shell (its kv_children count is
 * what the Python core keeps in its _kv_children dict). Verdict ids: 0 unkeyed, 1 inner, 2
 * worthless, 3 + 3*d + k the valued verdicts of depth slot d. Efficiency classes (levels of the
 * victim index) are distinct efficiency tuples; class 0 is all zeros. Floats are combined in the
 * Python index's order, so victims are bit-identical (built with -ffp-contract=off).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { KV_LEAF = 0, KV_INNER = 1, STATE = 2, DEAD = 3 };
enum { CANDIDATES = 0, OTHERS = 1 };
enum { V_UNKEYED = 0, V_INNER = 1, V_WORTHLESS = 2, V_FIRST_VALUED = 3 };
#define NONE_ID (-1)
#define SLACK 64

/* ------------------------------------------------------------------ small containers */
/* Small vectors whose one item lives inline (cap 0: at most one, in `one`; else `v`, malloc'd):
   nearly every block has one key and nearly every prefix one block per group, and at 10^6 blocks
   a separate allocation is a cache miss per victim. */
typedef struct { int32_t n, cap; union { int32_t *v; int32_t one; }; } IntVec;   /* block ids, unordered */
typedef struct { int32_t node, group; } Key;
typedef struct { int32_t n, cap; union { Key *v; Key one; }; } KeyVec;
static inline int32_t *iv_items(IntVec *s) { return s->cap ? s->v : &s->one; }
static inline Key *kv_items(KeyVec *k) { return k->cap ? k->v : &k->one; }
/* A block's row: its keys, its verdict, its release number while free and cached (0 else), and
   its place in the victim index (level and tier ids, NONE_ID if none; the release number it was
   placed with). */
typedef struct { KeyVec keys; int64_t free_seq, seq_of; int32_t verdict, level_of; int8_t tier_of; } Row;
typedef struct { Py_ssize_t n, cap; uint64_t *v; } Heap;

static int grow(void **v, int32_t *cap, size_t item, int32_t need) {
    if (need <= *cap) return 0;
    int32_t c = *cap ? *cap : 2;
    while (c < need) c *= 2;
    void *p = realloc(*v, (size_t)c * item);
    if (!p) { PyErr_NoMemory(); return -1; }
    *v = p; *cap = c;
    return 0;
}

/* Room for `need` items in an inline-able vector (items of `item` bytes at `*v`, or inline at
   `one` while *cap is 0 and need <= 1). 0, or -1 with MemoryError. */
static int reserve(void **v, void *one, int32_t *cap, int32_t n, size_t item, int32_t need) {
    if (*cap == 0) {
        if (need <= 1) return 0;
        void *heap = malloc(item * 4 > item * (size_t)need ? item * 4 : item * (size_t)need);
        if (!heap) { PyErr_NoMemory(); return -1; }
        if (n) memcpy(heap, one, item);
        *v = heap;
        *cap = need > 4 ? need : 4;
        return 0;
    }
    return grow(v, cap, item, need);
}

static int heap_push(Heap *h, uint64_t x) {
    if (h->n == h->cap) {
        Py_ssize_t c = h->cap ? h->cap * 2 : 8;
        uint64_t *p = realloc(h->v, (size_t)c * sizeof(uint64_t));
        if (!p) { PyErr_NoMemory(); return -1; }
        h->v = p; h->cap = c;
    }
    Py_ssize_t i = h->n++;
    uint64_t *a = h->v;
    while (i > 0) {
        Py_ssize_t parent = (i - 1) >> 1;
        if (a[parent] <= x) break;
        a[i] = a[parent];
        i = parent;
    }
    a[i] = x;
    return 0;
}

static void heap_sift_down(uint64_t *a, Py_ssize_t n, Py_ssize_t i) {
    uint64_t x = a[i];
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && a[c + 1] < a[c]) c++;
        if (a[c] >= x) break;
        a[i] = a[c];
        i = c;
    }
    a[i] = x;
}

static void heap_pop(Heap *h) {
    h->n--;
    if (h->n > 0) {
        h->v[0] = h->v[h->n];
        heap_sift_down(h->v, h->n, 0);
    }
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* ------------------------------------------------------------------ nodes */
typedef struct {
    PyObject *prefix;       /* owned; NULL: a free slot */
    PyObject *parent;       /* owned or NULL */
    int64_t depth;
    int32_t slot;           /* depth slot (valued verdicts), -1 for a shell */
    int32_t parent_id;      /* parent's node id, valid while n_attn > 0 (its kv_children holds it) */
    int32_t n_state, n_attn, kv_children;
    uint8_t live, dirty;
    IntVec *groups;         /* num_groups sets of block ids */
} Node;

typedef struct {
    int32_t tier, cls;
    Heap heap;
    Py_ssize_t num_live;
} Level;

typedef struct {
    Py_ssize_t num_live;
    Heap min_heap, max_heap;          /* max_heap holds ~entry */
    int32_t *sorted[2];               /* per variant: non-empty level ids by efficiency (ascending) */
    int32_t num_sorted, cap_sorted;
} Tier;

typedef struct {
    PyObject_HEAD
    int32_t num_groups, num_state_groups, num_attn_groups, num_variants;
    uint8_t *is_attn;
    int32_t num_blocks;
    PyObject *effs_of;                /* depth -> tuple of num_variants floats */
    /* nodes */
    PyObject *node_of;                /* dict prefix -> int node id, lazily cleaned (node_lookup) */
    PyObject **id_ints; int32_t cap_id_ints;   /* node id -> its int, made once (the dict's values) */
    Node *nodes; int32_t num_nodes, cap_nodes;
    int32_t *free_nodes; int32_t num_free_nodes, cap_free_nodes;
    int32_t *dirty; int32_t num_dirty, cap_dirty;
    /* depths and efficiency classes */
    PyObject *slot_of;                /* dict depth -> int slot */
    int32_t *slot_cls; PyObject **slot_effs; int32_t num_slots, cap_slots;   /* slot -> class, its effs tuple */
    double *cls_effs; int32_t num_cls, cap_cls;                              /* class -> num_variants doubles */
    PyObject **cls_tuple; int32_t cap_cls_tuple;                             /* class -> an effs tuple (borrowed from a slot, or zeros) */
    PyObject *zero_effs;
    /* blocks: one row each (what an eviction reads, in one place: at 10^6 blocks each array a
       victim touches is a cache miss of its own), and their release numbers apart */
    Row *row;
    int64_t *release_seq;
    PyObject *reason;                 /* list of ints */
    int64_t seq;
    /* the victim index */
    int shift; uint64_t mask;
    Tier tiers[2];
    Level *levels; int32_t num_levels, cap_levels;   /* level id = cls * 2 + tier */
    PyObject *reason_ints[4];
} Core;

/* verdict tables: candidate?, class, reason */
static inline int v_cand(int32_t v) { return v < V_FIRST_VALUED ? v == V_WORTHLESS : ((v - V_FIRST_VALUED) % 3) != 2; }
static inline int v_reason(int32_t v) {
    if (v < V_FIRST_VALUED) return v == V_INNER ? KV_INNER : DEAD;
    return ((v - V_FIRST_VALUED) % 3) == 0 ? KV_LEAF : STATE;
}
static inline int32_t v_cls(Core *c, int32_t v) { return v < V_FIRST_VALUED ? 0 : c->slot_cls[(v - V_FIRST_VALUED) / 3]; }

/* ------------------------------------------------------------------ id sets */
static int set_contains(IntVec *s, int32_t x) {
    int32_t *items = iv_items(s);
    for (int32_t i = 0; i < s->n; i++) if (items[i] == x) return 1;
    return 0;
}
static int set_add(IntVec *s, int32_t x) {
    if (set_contains(s, x)) return 0;
    if (reserve((void **)&s->v, &s->one, &s->cap, s->n, sizeof(int32_t), s->n + 1) < 0) return -1;
    iv_items(s)[s->n++] = x;
    return 0;
}
static void set_discard(IntVec *s, int32_t x) {
    for (int32_t i = 0; i < s->n; i++)
        if (iv_items(s)[i] == x) { iv_items(s)[i] = iv_items(s)[--s->n]; return; }
}

/* ------------------------------------------------------------------ the victim index */
static int ensure_levels(Core *c, int32_t cls) {
    int32_t need = (cls + 1) * 2;
    if (need <= c->num_levels) return 0;
    if (grow((void **)&c->levels, &c->cap_levels, sizeof(Level), need) < 0) return -1;
    for (int32_t i = c->num_levels; i < need; i++) {
        memset(&c->levels[i], 0, sizeof(Level));
        c->levels[i].tier = i & 1;
        c->levels[i].cls = i >> 1;
    }
    c->num_levels = need;
    return 0;
}

static inline double level_eff(Core *c, int32_t level_id, int variant) {
    return c->cls_effs[(size_t)(level_id >> 1) * c->num_variants + variant];
}

static int level_filled(Core *c, int32_t level_id) {
    Tier *t = &c->tiers[level_id & 1];
    if (t->num_sorted == t->cap_sorted) {
        int32_t cap = t->cap_sorted ? t->cap_sorted * 2 : 8;
        for (int v = 0; v < c->num_variants; v++) {
            int32_t *p = realloc(t->sorted[v], (size_t)cap * sizeof(int32_t));
            if (!p) { PyErr_NoMemory(); return -1; }
            t->sorted[v] = p;
        }
        t->cap_sorted = cap;
    }
    for (int v = 0; v < c->num_variants; v++) {
        double e = level_eff(c, level_id, v);
        int32_t *a = t->sorted[v];
        int32_t lo = 0, hi = t->num_sorted;       /* insort_right: after every equal efficiency */
        while (lo < hi) {
            int32_t mid = (lo + hi) >> 1;
            if (e < level_eff(c, a[mid], v)) hi = mid; else lo = mid + 1;
        }
        memmove(a + lo + 1, a + lo, (size_t)(t->num_sorted - lo) * sizeof(int32_t));
        a[lo] = level_id;
    }
    t->num_sorted++;
    return 0;
}

static void level_emptied(Core *c, Level *level, int32_t level_id) {
    level->heap.n = 0;
    Tier *t = &c->tiers[level_id & 1];
    for (int v = 0; v < c->num_variants; v++) {
        int32_t *a = t->sorted[v];
        for (int32_t i = 0; i < t->num_sorted; i++)
            if (a[i] == level_id) {
                memmove(a + i, a + i + 1, (size_t)(t->num_sorted - i - 1) * sizeof(int32_t));
                break;
            }
    }
    t->num_sorted--;
}

static inline int valid_in_level(Core *c, uint64_t e, int32_t level_id) {
    int32_t b = (int32_t)(e & c->mask);
    return c->row[b].level_of == level_id && (uint64_t)c->row[b].seq_of == (e >> c->shift);
}
static inline int valid_in_tier(Core *c, uint64_t e, int tier) {
    int32_t b = (int32_t)(e & c->mask);
    return c->row[b].tier_of == tier && (uint64_t)c->row[b].seq_of == (e >> c->shift);
}

/* Keep a heap's live entries once each (negated: a max-heap of ~entry). */
static void sweep(Core *c, Heap *h, int is_level, int32_t owner, int negated) {
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < h->n; i++) {
        uint64_t e = negated ? ~h->v[i] : h->v[i];
        if (is_level ? valid_in_level(c, e, owner) : valid_in_tier(c, e, owner)) h->v[k++] = h->v[i];
    }
    qsort(h->v, (size_t)k, sizeof(uint64_t), cmp_u64);         /* sorted: a heap already */
    Py_ssize_t u = 0;
    for (Py_ssize_t i = 0; i < k; i++) if (u == 0 || h->v[i] != h->v[u - 1]) h->v[u++] = h->v[i];
    h->n = u;
}

static int into_level(Core *c, int32_t level_id, uint64_t entry) {
    Level *level = &c->levels[level_id];
    if (heap_push(&level->heap, entry) < 0) return -1;
    level->num_live++;
    if (level->num_live == 1) return level_filled(c, level_id);
    if (level->heap.n > 2 * level->num_live + SLACK) sweep(c, &level->heap, 1, level_id, 0);
    return 0;
}

static void index_discard(Core *c, int32_t b) {
    int32_t level_id = c->row[b].level_of;
    if (level_id == NONE_ID) return;
    Level *level = &c->levels[level_id];
    c->row[b].level_of = NONE_ID;
    c->row[b].tier_of = NONE_ID;
    if (--level->num_live == 0) level_emptied(c, level, level_id);
    Tier *t = &c->tiers[level_id & 1];
    if (--t->num_live == 0) { t->min_heap.n = 0; t->max_heap.n = 0; }
}

static int index_place(Core *c, int32_t b, int tier, int32_t cls, int64_t seq) {
    if (ensure_levels(c, cls) < 0) return -1;
    int32_t level_id = cls * 2 + tier;
    int32_t current = c->row[b].level_of;
    if (current != NONE_ID) {
        if (c->row[b].seq_of != seq || c->row[b].tier_of != tier) {
            index_discard(c, b);
        } else if (current == level_id) {
            return 0;
        } else {                                  /* same set, same release number: only its level */
            c->row[b].level_of = level_id;
            Level *old = &c->levels[current];
            if (--old->num_live == 0) level_emptied(c, old, current);
            return into_level(c, level_id, ((uint64_t)seq << c->shift) | (uint64_t)b);
        }
    }
    c->row[b].level_of = level_id;
    c->row[b].tier_of = (int8_t)tier;
    c->row[b].seq_of = seq;
    uint64_t entry = ((uint64_t)seq << c->shift) | (uint64_t)b;
    if (into_level(c, level_id, entry) < 0) return -1;
    Tier *t = &c->tiers[tier];
    if (heap_push(&t->min_heap, entry) < 0 || heap_push(&t->max_heap, ~entry) < 0) return -1;
    t->num_live++;
    if (t->min_heap.n > 2 * t->num_live + SLACK) sweep(c, &t->min_heap, 0, tier, 0);
    if (t->max_heap.n > 2 * t->num_live + SLACK) sweep(c, &t->max_heap, 0, tier, 1);
    return 0;
}

/* The scan's victim (victim_index.VictimIndex.victim, the same float operations), or -1. */
static int32_t index_victim(Core *c, double alpha, int variant) {
    int tier_id = CANDIDATES;
    Tier *t = &c->tiers[CANDIDATES];
    if (!t->num_live) {
        tier_id = OTHERS; t = &c->tiers[OTHERS];
        if (!t->num_live) return -1;
    }
    const int shift = c->shift;
    const uint64_t mask = c->mask;
    Heap *h = &t->min_heap;
    while (!valid_in_tier(c, h->v[0], tier_id)) heap_pop(h);
    uint64_t head = h->v[0];
    int32_t *levels = t->sorted[variant];
    int32_t nl = t->num_sorted;
    double e_lo = level_eff(c, levels[0], variant);
    double range_e = level_eff(c, levels[nl - 1], variant) - e_lo;
    if (alpha == 0.0 || !(range_e > 0)) return (int32_t)(head & mask);
    h = &t->max_heap;
    while (!valid_in_tier(c, ~h->v[0], tier_id)) heap_pop(h);
    uint64_t top = ~h->v[0];
    double lo = (double)(head >> shift);
    double range_r = (double)(top >> shift) - lo;
    int64_t best_entry = -1;
    double best_score = 0.0;
    for (int32_t i = 0; i < nl; i++) {
        int32_t level_id = levels[i];
        double eff = level_eff(c, level_id, variant);
        double eff_term = alpha * ((eff - e_lo) / range_e);
        if (eff_term > best_score && best_entry >= 0) break;
        Heap *lh = &c->levels[level_id].heap;
        while (!valid_in_level(c, lh->v[0], level_id)) heap_pop(lh);
        int64_t entry = (int64_t)lh->v[0];
        if (best_entry >= 0 && entry > best_entry) continue;
        double score = (range_r > 0 ? ((double)((uint64_t)entry >> shift) - lo) / range_r : 0.0) + eff_term;
        if (best_entry < 0 || score < best_score || (score == best_score && entry < best_entry)) {
            best_entry = entry; best_score = score;
        }
    }
    return (int32_t)((uint64_t)best_entry & mask);
}

static void index_clear(Core *c) {
    for (int tier = 0; tier < 2; tier++) {
        Tier *t = &c->tiers[tier];
        t->num_live = 0; t->min_heap.n = 0; t->max_heap.n = 0; t->num_sorted = 0;
    }
    for (int32_t i = 0; i < c->num_levels; i++) { c->levels[i].heap.n = 0; c->levels[i].num_live = 0; }
    for (int32_t b = 0; b < c->num_blocks; b++) { c->row[b].level_of = NONE_ID; c->row[b].tier_of = NONE_ID; }
}

/* ------------------------------------------------------------------ depth slots and classes */
static int32_t slot_for(Core *c, int64_t depth) {
    PyObject *key = PyLong_FromLongLong(depth);
    if (!key) return -1;
    PyObject *found = PyDict_GetItemWithError(c->slot_of, key);
    if (found) { Py_DECREF(key); return (int32_t)PyLong_AsLong(found); }
    if (PyErr_Occurred()) { Py_DECREF(key); return -1; }
    if (!c->effs_of) { PyErr_SetString(PyExc_RuntimeError, "BlockCore cleared"); Py_DECREF(key); return -1; }
    PyObject *effs = PyObject_CallOneArg(c->effs_of, key);
    if (!effs) { Py_DECREF(key); return -1; }
    if (!PyTuple_Check(effs) || PyTuple_GET_SIZE(effs) != c->num_variants) {
        PyErr_Format(PyExc_ValueError, "effs_of(%lld) must return a tuple of %d floats", (long long)depth, c->num_variants);
        Py_DECREF(effs); Py_DECREF(key); return -1;
    }
    double vals[8];
    for (int v = 0; v < c->num_variants; v++) {
        vals[v] = PyFloat_AsDouble(PyTuple_GET_ITEM(effs, v));
        if (vals[v] == -1.0 && PyErr_Occurred()) { Py_DECREF(effs); Py_DECREF(key); return -1; }
    }
    int32_t cls = -1;
    for (int32_t k = 0; k < c->num_cls && cls < 0; k++) {
        int same = 1;
        for (int v = 0; v < c->num_variants; v++) if (!(c->cls_effs[(size_t)k * c->num_variants + v] == vals[v])) same = 0;
        if (same) cls = k;
    }
    if (cls < 0) {
        int32_t cap = c->cap_cls;
        if (c->num_cls == cap) {
            int32_t newcap = cap ? cap * 2 : 16;
            double *p = realloc(c->cls_effs, (size_t)newcap * c->num_variants * sizeof(double));
            PyObject **q = p ? realloc(c->cls_tuple, (size_t)newcap * sizeof(PyObject *)) : NULL;
            if (p) c->cls_effs = p;
            if (!p || !q) { PyErr_NoMemory(); Py_DECREF(effs); Py_DECREF(key); return -1; }
            c->cls_tuple = q; c->cap_cls = newcap;
        }
        cls = c->num_cls++;
        memcpy(&c->cls_effs[(size_t)cls * c->num_variants], vals, (size_t)c->num_variants * sizeof(double));
        c->cls_tuple[cls] = effs;      /* borrowed from the slot below, which keeps it */
    }
    int32_t slot = c->num_slots;
    if (grow((void **)&c->slot_cls, &c->cap_slots, sizeof(int32_t), slot + 1) < 0) { Py_DECREF(effs); Py_DECREF(key); return -1; }
    PyObject **q = realloc(c->slot_effs, (size_t)c->cap_slots * sizeof(PyObject *));   /* slot_cls's capacity */
    if (!q) { PyErr_NoMemory(); Py_DECREF(effs); Py_DECREF(key); return -1; }
    c->slot_effs = q;
    c->slot_cls[slot] = cls;
    c->slot_effs[slot] = effs;          /* owned */
    PyObject *value = PyLong_FromLong(slot);
    if (!value || PyDict_SetItem(c->slot_of, key, value) < 0) { Py_XDECREF(value); Py_DECREF(key); return -1; }
    Py_DECREF(value); Py_DECREF(key);
    c->num_slots++;
    return slot;
}

/* ------------------------------------------------------------------ nodes */
/* node_of maps a prefix to its node id lazily: freeing a node leaves its entry (deleting a key from
   a pool-sized dict cost ~0.4 us a victim at 10^6 blocks, most of a victim's cost: cache misses on
   the dict's tables), so a found id counts only while its node still holds an equal prefix. A new
   node for that prefix overwrites the entry; the rest are dropped in one rebuild once they outnumber
   the nodes that hold a prefix (plus STALE_SLACK), each entry once: amortised O(1) a node, the
   cost profile of a dict's own resize. */
#define STALE_SLACK 1024

static inline int32_t node_lookup(Core *c, PyObject *prefix) {
    PyObject *found = PyDict_GetItemWithError(c->node_of, prefix);
    if (!found) return PyErr_Occurred() ? -2 : -1;
    int32_t id = (int32_t)PyLong_AsLong(found);
    PyObject *held = c->nodes[id].prefix;
    if (held == prefix) return id;
    if (!held) return -1;                     /* freed: a stale entry */
    int same = PyObject_RichCompareBool(held, prefix, Py_EQ);
    if (same < 0) return -2;
    return same ? id : -1;                    /* reused for another prefix: stale */
}

static PyObject *id_int(Core *c, int32_t id) {
    if (id >= c->cap_id_ints) {
        int32_t cap = c->cap_id_ints ? c->cap_id_ints : 64;
        while (cap <= id) cap *= 2;
        PyObject **p = realloc(c->id_ints, (size_t)cap * sizeof(PyObject *));
        if (!p) { PyErr_NoMemory(); return NULL; }
        memset(p + c->cap_id_ints, 0, (size_t)(cap - c->cap_id_ints) * sizeof(PyObject *));
        c->id_ints = p; c->cap_id_ints = cap;
    }
    if (!c->id_ints[id] && !(c->id_ints[id] = PyLong_FromLong(id))) return NULL;
    return c->id_ints[id];                    /* borrowed */
}

/* Drop node_of's stale entries: a new dict of the nodes that hold a prefix. 0, or -1 (memory). */
static int node_of_rebuild(Core *c) {
    int32_t holding = c->num_nodes - c->num_free_nodes;
    PyObject *fresh = _PyDict_NewPresized(holding);
    if (!fresh) return -1;
    for (int32_t id = 0; id < c->num_nodes; id++) {
        Node *n = &c->nodes[id];
        if (!n->prefix) continue;
        PyObject *value = id_int(c, id);
        if (!value || PyDict_SetItem(fresh, n->prefix, value) < 0) { Py_DECREF(fresh); return -1; }
    }
    Py_SETREF(c->node_of, fresh);
    return 0;
}

static int32_t node_new(Core *c, PyObject *prefix) {
    int32_t id;
    if (c->num_free_nodes) {
        id = c->free_nodes[--c->num_free_nodes];
    } else {
        if (grow((void **)&c->nodes, &c->cap_nodes, sizeof(Node), c->num_nodes + 1) < 0) return -2;
        id = c->num_nodes;
        Node *n = &c->nodes[id];
        memset(n, 0, sizeof(Node));
        n->groups = calloc((size_t)c->num_groups, sizeof(IntVec));
        if (!n->groups) { PyErr_NoMemory(); return -2; }
        c->num_nodes++;
    }
    PyObject *value = id_int(c, id);
    if (!value || PyDict_SetItem(c->node_of, prefix, value) < 0) {      /* a stale entry is overwritten */
        if (grow((void **)&c->free_nodes, &c->cap_free_nodes, sizeof(int32_t), c->num_free_nodes + 1) == 0)
            c->free_nodes[c->num_free_nodes++] = id;
        return -2;
    }
    Node *n = &c->nodes[id];
    Py_INCREF(prefix);
    n->prefix = prefix;
    n->parent = NULL;
    n->slot = -1;
    n->depth = 0;
    n->n_state = n->n_attn = n->kv_children = 0;
    n->live = 0;
    /* n->dirty kept: a dirty slot is in the dirty list, refreshing it again is harmless */
    return id;
}

static int node_free(Core *c, int32_t id) {
    Node *n = &c->nodes[id];
    Py_CLEAR(n->prefix);                       /* its node_of entry is now stale (node_lookup) */
    Py_CLEAR(n->parent);
    n->live = 0;
    if (grow((void **)&c->free_nodes, &c->cap_free_nodes, sizeof(int32_t), c->num_free_nodes + 1) < 0) return -1;
    c->free_nodes[c->num_free_nodes++] = id;
    int32_t holding = c->num_nodes - c->num_free_nodes;
    if (PyDict_GET_SIZE(c->node_of) > 2 * (Py_ssize_t)holding + STALE_SLACK) return node_of_rebuild(c);
    return 0;
}

static int mark_dirty(Core *c, int32_t id) {
    Node *n = &c->nodes[id];
    if (n->dirty) return 0;
    if (grow((void **)&c->dirty, &c->cap_dirty, sizeof(int32_t), c->num_dirty + 1) < 0) return -1;
    c->dirty[c->num_dirty++] = id;
    n->dirty = 1;
    return 0;
}

/* ------------------------------------------------------------------ judgements */
static inline void verdicts_of(Core *c, Node *n, int32_t *attn, int32_t *state) {
    int32_t kvc = n->kv_children;
    int32_t base = V_FIRST_VALUED + 3 * n->slot;
    if (n->n_state != c->num_state_groups) {
        *attn = kvc ? V_INNER : V_WORTHLESS;
        *state = V_WORTHLESS;
        return;
    }
    *attn = kvc ? V_INNER : base;
    if (n->n_attn != c->num_attn_groups) { *state = V_WORTHLESS; return; }
    *state = kvc <= 1 ? base + 1 : base + 2;
}

static int set_verdict(Core *c, int32_t b, int32_t v) {
    c->row[b].verdict = v;
    PyObject *r = c->reason_ints[v_reason(v)];
    PyObject **items = ((PyListObject *)c->reason)->ob_item;
    PyObject *old = items[b];
    if (old != r) { Py_INCREF(r); items[b] = r; Py_DECREF(old); }
    int64_t seq = c->row[b].free_seq;
    if (seq) return index_place(c, b, v_cand(v) ? CANDIDATES : OTHERS, v_cls(c, v), seq);
    return 0;
}

static int refresh_block(Core *c, int32_t b) {
    KeyVec *keys = &c->row[b].keys;
    int32_t v;
    if (!keys->n) {
        v = V_UNKEYED;
    } else {
        Key *items = kv_items(keys);
        Key k = items[0];
        for (int32_t i = 1; i < keys->n; i++)           /* its deepest key decides (the first of equals) */
            if (c->nodes[items[i].node].depth > c->nodes[k.node].depth) k = items[i];
        Node *n = &c->nodes[k.node];
        if (n->groups[k.group].n > 1) {
            v = V_WORTHLESS;
        } else {
            int32_t attn, state;
            verdicts_of(c, n, &attn, &state);
            v = c->is_attn[k.group] ? attn : state;
        }
    }
    if (v == c->row[b].verdict) return 0;
    return set_verdict(c, b, v);
}

static int refresh_node(Core *c, int32_t id, int32_t only_group) {
    Node *n = &c->nodes[id];
    int32_t attn, state;
    verdicts_of(c, n, &attn, &state);
    for (int32_t g = 0; g < c->num_groups; g++) {
        IntVec *ids = &n->groups[g];
        if (!ids->n || (only_group >= 0 && g != only_group)) continue;
        int32_t v = ids->n == 1 ? (c->is_attn[g] ? attn : state) : V_WORTHLESS;
        for (int32_t i = 0; i < ids->n; i++) {
            int32_t b = iv_items(ids)[i];
            if (c->row[b].verdict == v) continue;
            if (c->row[b].keys.n > 1) { if (refresh_block(c, b) < 0) return -1; continue; }
            if (set_verdict(c, b, v) < 0) return -1;
        }
    }
    return 0;
}

static int flush(Core *c) {
    while (c->num_dirty) {
        int32_t id = c->dirty[--c->num_dirty];
        Node *n = &c->nodes[id];
        n->dirty = 0;
        if (n->live && refresh_node(c, id, -1) < 0) return -1;
    }
    return 0;
}

static int check_block(Core *c, Py_ssize_t b) {
    if (b < 0 || b >= c->num_blocks) {
        PyErr_Format(PyExc_IndexError, "block id %zd out of range [0, %d)", b, c->num_blocks);
        return -1;
    }
    return 0;
}

static int check_group(Core *c, Py_ssize_t g) {
    if (g < 0 || g >= c->num_groups) {
        PyErr_Format(PyExc_IndexError, "group id %zd out of range [0, %d)", g, c->num_groups);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ events */
static PyObject *Core_cached(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) { PyErr_SetString(PyExc_TypeError, "cached(block_id, prefix, group_id, depth, parent)"); return NULL; }
    Py_ssize_t b = PyLong_AsSsize_t(args[0]);
    if (b == -1 && PyErr_Occurred()) return NULL;
    PyObject *prefix = args[1];
    Py_ssize_t g = PyLong_AsSsize_t(args[2]);
    if (g == -1 && PyErr_Occurred()) return NULL;
    long long depth = PyLong_AsLongLong(args[3]);
    if (depth == -1 && PyErr_Occurred()) return NULL;
    PyObject *parent = args[4] == Py_None ? NULL : args[4];
    if (check_block(c, b) < 0 || check_group(c, g) < 0) return NULL;
    int32_t id = node_lookup(c, prefix);
    if (id == -2) return NULL;
    if (id < 0) { id = node_new(c, prefix); if (id < 0) return NULL; }
    Node *n = &c->nodes[id];
    if (!n->live) {                       /* new, or a shell: a prefix from now */
        int32_t slot = slot_for(c, depth);
        if (slot < 0) {
            if (!n->kv_children && node_free(c, id) < 0) return NULL;
            return NULL;
        }
        n = &c->nodes[id];
        n->slot = slot;
        n->depth = depth;
        Py_XINCREF(parent);
        Py_XSETREF(n->parent, parent);
        n->live = 1;
    }
    IntVec *ids = &n->groups[g];
    if (ids->n) {
        if (set_add(ids, (int32_t)b) < 0) return NULL;     /* a second copy: duplicates */
    } else {
        if (set_add(ids, (int32_t)b) < 0) return NULL;
        if (c->is_attn[g]) {
            n->n_attn++;
            if (n->n_attn == 1 && n->parent) {              /* the parent depends on "does it hold KVs" */
                PyObject *p = n->parent;
                int32_t pid = node_lookup(c, p);
                if (pid == -2) return NULL;
                if (pid < 0) { pid = node_new(c, p); if (pid < 0) return NULL; }
                c->nodes[pid].kv_children++;
                if (mark_dirty(c, pid) < 0) return NULL;
                n = &c->nodes[id];
                n->parent_id = pid;
            }
        } else {
            n->n_state++;
        }
    }
    KeyVec *keys = &c->row[b].keys;
    if (reserve((void **)&keys->v, &keys->one, &keys->cap, keys->n, sizeof(Key), keys->n + 1) < 0) return NULL;
    kv_items(keys)[keys->n].node = id;
    kv_items(keys)[keys->n].group = (int32_t)g;
    keys->n++;
    if (mark_dirty(c, id) < 0) return NULL;
    Py_RETURN_NONE;
}

/* Drop block b's key at index `at` of its keys (node id, group g): uncached() past its lookups, and
   evict()'s per key. 0, or -1 with an exception set. */
static int uncache_key(Core *c, int32_t b, int32_t at) {
    KeyVec *keys = &c->row[b].keys;
    Key *items = kv_items(keys);
    int32_t id = items[at].node, g = items[at].group;
    memmove(items + at, items + at + 1, (size_t)(keys->n - at - 1) * sizeof(Key));
    keys->n--;
    Node *n = &c->nodes[id];
    if (!n->live) { PyErr_SetObject(PyExc_KeyError, n->prefix ? n->prefix : Py_None); return -1; }
    IntVec *ids = &n->groups[g];
    int refresh_all = 0, refresh_parent = 0;
    int32_t pid = -1;
    if (set_contains(ids, b)) {
        set_discard(ids, b);
        if (!ids->n) {
            if (c->is_attn[g]) {
                refresh_all = n->n_attn == c->num_attn_groups;     /* the states' verdict reads it */
                n->n_attn--;
                if (!n->n_attn && n->parent) {
                    refresh_parent = 1;
                    pid = n->parent_id;              /* held by its kv_children until now */
                    Node *p = &c->nodes[pid];
                    if (--p->kv_children == 0 && !p->live) {
                        if (node_free(c, pid) < 0) return -1;
                        pid = -1;
                    }
                }
            } else {
                refresh_all = n->n_state == c->num_state_groups;   /* every verdict reads it */
                n->n_state--;
            }
        }
    }
    if (keys->n) {
        if (refresh_block(c, b) < 0) return -1;
    } else {                      /* still free, but a block without a hash: no member, no value */
        c->row[b].free_seq = 0;
        index_discard(c, b);
        if (set_verdict(c, b, V_UNKEYED) < 0) return -1;
    }
    int rc = 0;
    if (!n->n_attn && !n->n_state) {
        n->live = 0;
        n->slot = -1;
        if (!n->kv_children) rc = node_free(c, id);
        else Py_CLEAR(n->parent);
    } else if (refresh_all) {
        rc = refresh_node(c, id, -1);
    } else if (ids->n == 1) {
        rc = refresh_node(c, id, (int32_t)g);
    }
    if (rc == 0 && refresh_parent && pid >= 0 && c->nodes[pid].live) rc = refresh_node(c, pid, -1);
    return rc;
}

static PyObject *Core_uncached(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) { PyErr_SetString(PyExc_TypeError, "uncached(block_id, prefix, group_id)"); return NULL; }
    Py_ssize_t b = PyLong_AsSsize_t(args[0]);
    if (b == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t g = PyLong_AsSsize_t(args[2]);
    if (g == -1 && PyErr_Occurred()) return NULL;
    if (check_block(c, b) < 0) return NULL;
    KeyVec *keys = &c->row[b].keys;
    if (!keys->n) Py_RETURN_NONE;
    int32_t id = node_lookup(c, args[1]);
    if (id == -2) return NULL;
    if (id < 0) Py_RETURN_NONE;
    for (int32_t i = 0; i < keys->n; i++)
        if (kv_items(keys)[i].node == id && kv_items(keys)[i].group == g) {
            if (uncache_key(c, (int32_t)b, i) < 0) return NULL;
            break;
        }
    Py_RETURN_NONE;
}

static PyObject *Core_released(Core *c, PyObject *arg) {
    Py_ssize_t b = PyLong_AsSsize_t(arg);
    if (b == -1 && PyErr_Occurred()) return NULL;
    if (check_block(c, b) < 0) return NULL;
    if (c->num_dirty && flush(c) < 0) return NULL;
    int64_t seq = ++c->seq;
    c->release_seq[b] = c->row[b].free_seq = seq;
    int32_t v = c->row[b].verdict;
    if (index_place(c, (int32_t)b, v_cand(v) ? CANDIDATES : OTHERS, v_cls(c, v), seq) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Core_taken(Core *c, PyObject *arg) {
    Py_ssize_t b = PyLong_AsSsize_t(arg);
    if (b == -1 && PyErr_Occurred()) return NULL;
    if (check_block(c, b) < 0) return NULL;
    c->row[b].free_seq = 0;
    index_discard(c, (int32_t)b);
    Py_RETURN_NONE;
}

/* victim() and evict()'s (alpha, variant) arguments: 0, or -1 with an exception set. */
static int parse_rule(Core *c, PyObject *const *args, double *alpha, int *variant) {
    *alpha = PyFloat_AsDouble(args[0]);
    if (*alpha == -1.0 && PyErr_Occurred()) return -1;
    Py_ssize_t v = PyLong_AsSsize_t(args[1]);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < 0 || v >= c->num_variants) { PyErr_SetString(PyExc_IndexError, "variant out of range"); return -1; }
    *variant = (int)v;
    return 0;
}

/* A new (block id, reason id) tuple for block b, or NULL with an exception set. */
static PyObject *victim_pair(Core *c, int32_t b) {
    PyObject *block = PyLong_FromLong(b);
    if (!block) return NULL;
    PyObject *reason = c->reason_ints[v_reason(c->row[b].verdict)];
    Py_INCREF(reason);
    PyObject *out = PyTuple_New(2);
    if (!out) { Py_DECREF(block); Py_DECREF(reason); return NULL; }
    PyTuple_SET_ITEM(out, 0, block);
    PyTuple_SET_ITEM(out, 1, reason);
    return out;
}

static PyObject *Core_victim(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) { PyErr_SetString(PyExc_TypeError, "victim(alpha, variant)"); return NULL; }
    double alpha;
    int variant;
    if (parse_rule(c, args, &alpha, &variant) < 0) return NULL;
    if (c->num_dirty && flush(c) < 0) return NULL;
    int32_t b = index_victim(c, alpha, variant);
    if (b < 0) Py_RETURN_NONE;
    return victim_pair(c, b);
}

static PyObject *Core_evict(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) { PyErr_SetString(PyExc_TypeError, "evict(alpha, variant, count)"); return NULL; }
    double alpha;
    int variant;
    if (parse_rule(c, args, &alpha, &variant) < 0) return NULL;
    Py_ssize_t count = PyLong_AsSsize_t(args[2]);
    if (count == -1 && PyErr_Occurred()) return NULL;
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (c->num_dirty && flush(c) < 0) goto fail;
        int32_t b = index_victim(c, alpha, variant);
        if (b < 0) break;
        PyObject *pair = victim_pair(c, b);
        if (!pair) goto fail;
        int rc = PyList_Append(out, pair);
        Py_DECREF(pair);
        if (rc < 0) goto fail;
        c->row[b].free_seq = 0;                          /* taken(b) */
        index_discard(c, b);
        while (c->row[b].keys.n)                         /* uncached(b, prefix, group) per key, in order */
            if (uncache_key(c, b, 0) < 0) goto fail;
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

static PyObject *Core_clear(Core *c, PyObject *Py_UNUSED(ignored)) {
    for (int32_t id = 0; id < c->num_nodes; id++) {
        Node *n = &c->nodes[id];
        if (!n->prefix) continue;
        for (int32_t g = 0; g < c->num_groups; g++) n->groups[g].n = 0;
        n->n_attn = n->n_state = n->kv_children = 0;
        n->dirty = 0;
        if (node_free(c, id) < 0) return NULL;
    }
    for (int32_t id = 0; id < c->num_nodes; id++) c->nodes[id].dirty = 0;
    c->num_dirty = 0;
    for (int32_t b = 0; b < c->num_blocks; b++) {
        c->row[b].keys.n = 0;
        c->row[b].free_seq = 0;
        c->row[b].verdict = V_UNKEYED;
        PyObject **items = ((PyListObject *)c->reason)->ob_item;
        PyObject *r = c->reason_ints[DEAD];
        if (items[b] != r) { Py_INCREF(r); Py_SETREF(items[b], r); }
    }
    index_clear(c);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ reads */
static PyObject *Core_get_reason(Core *c, void *Py_UNUSED(closure)) {
    if (c->num_dirty && flush(c) < 0) return NULL;
    Py_INCREF(c->reason);
    return c->reason;
}

static Py_ssize_t Core_len(Core *c) { return c->tiers[0].num_live + c->tiers[1].num_live; }

static PyObject *Core_keys_of(Core *c, PyObject *arg) {
    Py_ssize_t b = PyLong_AsSsize_t(arg);
    if (b == -1 && PyErr_Occurred()) return NULL;
    if (check_block(c, b) < 0) return NULL;
    KeyVec *keys = &c->row[b].keys;
    PyObject *out = PyTuple_New(keys->n);
    if (!out) return NULL;
    for (int32_t i = 0; i < keys->n; i++) {
        Key k = kv_items(keys)[i];
        PyObject *pair = Py_BuildValue("(Oi)", c->nodes[k.node].prefix, k.group);
        if (!pair) { Py_DECREF(out); return NULL; }
        PyTuple_SET_ITEM(out, i, pair);
    }
    return out;
}

static PyObject *Core_prefix_info(Core *c, PyObject *prefix) {
    int32_t id = node_lookup(c, prefix);
    if (id == -2) return NULL;
    if (id < 0 || !c->nodes[id].live) { PyErr_SetObject(PyExc_KeyError, prefix); return NULL; }
    Node *n = &c->nodes[id];
    return Py_BuildValue("(LO)", (long long)n->depth, n->parent ? n->parent : Py_None);
}

static PyObject *verdict_tuple(Core *c, int32_t v) {
    PyObject *effs = v < V_FIRST_VALUED ? c->zero_effs : c->slot_effs[(v - V_FIRST_VALUED) / 3];
    return Py_BuildValue("(OOi)", v_cand(v) ? Py_True : Py_False, effs, v_reason(v));
}

/* (free_seq, release_seq, verdicts): two lists of ints and a list of (candidate, effs, reason) per block. */
static PyObject *Core_rows(Core *c, PyObject *Py_UNUSED(ignored)) {
    if (c->num_dirty && flush(c) < 0) return NULL;
    PyObject *free_seq = PyList_New(c->num_blocks), *release = PyList_New(c->num_blocks);
    PyObject *verdicts = PyList_New(c->num_blocks);
    PyObject *cache = PyDict_New();
    if (!free_seq || !release || !verdicts || !cache) goto fail;
    for (int32_t b = 0; b < c->num_blocks; b++) {
        PyObject *x = PyLong_FromLongLong(c->row[b].free_seq);
        if (!x) goto fail;
        PyList_SET_ITEM(free_seq, b, x);
        x = PyLong_FromLongLong(c->release_seq[b]);
        if (!x) goto fail;
        PyList_SET_ITEM(release, b, x);
        PyObject *key = PyLong_FromLong(c->row[b].verdict);
        if (!key) goto fail;
        PyObject *t = PyDict_GetItemWithError(cache, key);
        if (t) {
            Py_INCREF(t);
        } else {
            if (PyErr_Occurred() || !(t = verdict_tuple(c, c->row[b].verdict)) || PyDict_SetItem(cache, key, t) < 0) {
                Py_XDECREF(t); Py_DECREF(key); goto fail;
            }
        }
        Py_DECREF(key);
        PyList_SET_ITEM(verdicts, b, t);
    }
    Py_DECREF(cache);
    return Py_BuildValue("(NNN)", free_seq, release, verdicts);
fail:
    Py_XDECREF(free_seq); Py_XDECREF(release); Py_XDECREF(verdicts); Py_XDECREF(cache);
    return NULL;
}

/* (prefixes, kv_children, block_keys): {prefix: (parent, depth, [sorted ids per group], n_state, n_attn)},
 * {prefix: count} (counts > 0, shells included), {block: [(prefix, group), ...]}. */
static PyObject *Core_snapshot(Core *c, PyObject *Py_UNUSED(ignored)) {
    if (c->num_dirty && flush(c) < 0) return NULL;
    PyObject *prefixes = PyDict_New(), *kv = PyDict_New(), *bkeys = PyDict_New();
    if (!prefixes || !kv || !bkeys) goto fail;
    for (int32_t id = 0; id < c->num_nodes; id++) {
        Node *n = &c->nodes[id];
        if (!n->prefix) continue;
        if (n->kv_children) {
            PyObject *x = PyLong_FromLong(n->kv_children);
            if (!x || PyDict_SetItem(kv, n->prefix, x) < 0) { Py_XDECREF(x); goto fail; }
            Py_DECREF(x);
        }
        if (!n->live) continue;
        PyObject *groups = PyList_New(c->num_groups);
        if (!groups) goto fail;
        for (int32_t g = 0; g < c->num_groups; g++) {
            IntVec *ids = &n->groups[g];
            PyObject *l = PyList_New(ids->n);
            if (!l) { Py_DECREF(groups); goto fail; }
            for (int32_t i = 0; i < ids->n; i++) PyList_SET_ITEM(l, i, PyLong_FromLong(iv_items(ids)[i]));
            if (PyList_Sort(l) < 0) { Py_DECREF(l); Py_DECREF(groups); goto fail; }
            PyList_SET_ITEM(groups, g, l);
        }
        PyObject *row = Py_BuildValue("(OLNii)", n->parent ? n->parent : Py_None, (long long)n->depth, groups,
                                      n->n_state, n->n_attn);
        if (!row || PyDict_SetItem(prefixes, n->prefix, row) < 0) { Py_XDECREF(row); goto fail; }
        Py_DECREF(row);
    }
    for (int32_t b = 0; b < c->num_blocks; b++) {
        KeyVec *keys = &c->row[b].keys;
        if (!keys->n) continue;
        PyObject *l = PyList_New(keys->n);
        if (!l) goto fail;
        for (int32_t i = 0; i < keys->n; i++)
            PyList_SET_ITEM(l, i, Py_BuildValue("(Oi)", c->nodes[kv_items(keys)[i].node].prefix, kv_items(keys)[i].group));
        PyObject *key = PyLong_FromLong(b);
        if (!key || PyDict_SetItem(bkeys, key, l) < 0) { Py_XDECREF(key); Py_DECREF(l); goto fail; }
        Py_DECREF(key); Py_DECREF(l);
    }
    return Py_BuildValue("(NNN)", prefixes, kv, bkeys);
fail:
    Py_XDECREF(prefixes); Py_XDECREF(kv); Py_XDECREF(bkeys);
    return NULL;
}

/* The victim index's members: {block: (set, effs, release number)}. */
static PyObject *Core_members(Core *c, PyObject *Py_UNUSED(ignored)) {
    if (c->num_dirty && flush(c) < 0) return NULL;
    PyObject *out = PyDict_New();
    if (!out) return NULL;
    for (int32_t b = 0; b < c->num_blocks; b++) {
        int32_t level_id = c->row[b].level_of;
        if (level_id == NONE_ID) continue;
        int32_t cls = level_id >> 1;
        PyObject *effs = cls == 0 ? c->zero_effs : c->cls_tuple[cls];
        PyObject *row = Py_BuildValue("(iOL)", level_id & 1, effs, (long long)c->row[b].seq_of);
        PyObject *key = PyLong_FromLong(b);
        if (!row || !key || PyDict_SetItem(out, key, row) < 0) { Py_XDECREF(row); Py_XDECREF(key); Py_DECREF(out); return NULL; }
        Py_DECREF(row); Py_DECREF(key);
    }
    return out;
}

#define CHECK(cond, msg) do { if (!(cond)) { PyErr_SetString(PyExc_AssertionError, msg); return NULL; } } while (0)

/* Recount the index from the per-block records: AssertionError on drift. */
static PyObject *Core_check_index(Core *c, PyObject *Py_UNUSED(ignored)) {
    Py_ssize_t per_tier[2] = {0, 0};
    Py_ssize_t *per_level = calloc((size_t)c->num_levels + 1, sizeof(Py_ssize_t));
    if (!per_level) return PyErr_NoMemory();
    for (int32_t b = 0; b < c->num_blocks; b++) {
        int32_t level_id = c->row[b].level_of;
        if (level_id == NONE_ID) {
            if (c->row[b].tier_of != NONE_ID) { free(per_level); CHECK(0, "set without a level"); }
            continue;
        }
        if (c->row[b].tier_of != (level_id & 1)) { free(per_level); CHECK(0, "set and level disagree"); }
        per_tier[level_id & 1]++;
        per_level[level_id]++;
    }
    for (int32_t l = 0; l < c->num_levels; l++) {
        Level *level = &c->levels[l];
        if (level->num_live != per_level[l]) { free(per_level); CHECK(0, "level size drifted"); }
        Py_ssize_t seen = 0;
        for (Py_ssize_t i = 0; i < level->heap.n; i++) seen += valid_in_level(c, level->heap.v[i], l);
        if (seen < per_level[l]) { free(per_level); CHECK(0, "level heap lost a member"); }
        if (per_level[l]) {              /* the top, once cleaned (as victim cleans it), is the oldest member */
            while (!valid_in_level(c, level->heap.v[0], l)) heap_pop(&level->heap);
            uint64_t min_valid = UINT64_MAX;
            for (Py_ssize_t i = 0; i < level->heap.n; i++)
                if (valid_in_level(c, level->heap.v[i], l) && level->heap.v[i] < min_valid) min_valid = level->heap.v[i];
            if (level->heap.v[0] != min_valid) { free(per_level); CHECK(0, "stale or misplaced head of a level"); }
        }
    }
    for (int tier = 0; tier < 2; tier++) {
        Tier *t = &c->tiers[tier];
        if (t->num_live != per_tier[tier]) { free(per_level); CHECK(0, "set size drifted"); }
        Py_ssize_t filled = 0;
        for (int32_t l = tier; l < c->num_levels; l += 2) filled += per_level[l] > 0;
        if (t->num_sorted != filled) { free(per_level); CHECK(0, "sorted levels drifted"); }
        for (int v = 0; v < c->num_variants; v++)
            for (int32_t i = 0; i < t->num_sorted; i++) {
                int32_t l = t->sorted[v][i];
                if ((l & 1) != tier || !per_level[l]) { free(per_level); CHECK(0, "an empty or foreign level sorted"); }
                if (i && level_eff(c, t->sorted[v][i - 1], v) > level_eff(c, l, v)) { free(per_level); CHECK(0, "levels unsorted"); }
            }
        Py_ssize_t seen_min = 0, seen_max = 0;
        for (Py_ssize_t i = 0; i < t->min_heap.n; i++) seen_min += valid_in_tier(c, t->min_heap.v[i], tier);
        for (Py_ssize_t i = 0; i < t->max_heap.n; i++) seen_max += valid_in_tier(c, ~t->max_heap.v[i], tier);
        if (seen_min < per_tier[tier] || seen_max < per_tier[tier]) { free(per_level); CHECK(0, "a set's heap lost a member"); }
        if (per_tier[tier]) {
            while (!valid_in_tier(c, t->min_heap.v[0], tier)) heap_pop(&t->min_heap);
            while (!valid_in_tier(c, ~t->max_heap.v[0], tier)) heap_pop(&t->max_heap);
            uint64_t lo = UINT64_MAX, hi = 0;
            for (int32_t b = 0; b < c->num_blocks; b++)
                if (c->row[b].tier_of == tier) {
                    uint64_t e = ((uint64_t)c->row[b].seq_of << c->shift) | (uint64_t)b;
                    if (e < lo) lo = e;
                    if (e > hi) hi = e;
                }
            if (t->min_heap.v[0] != lo || ~t->max_heap.v[0] != hi) { free(per_level); CHECK(0, "stale or misplaced top of a set"); }
        }
    }
    free(per_level);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ type */
static void Core_dealloc(Core *c) {
    PyObject_GC_UnTrack(c);
    for (int32_t id = 0; id < c->num_nodes; id++) {
        Node *n = &c->nodes[id];
        Py_XDECREF(n->prefix); Py_XDECREF(n->parent);
        if (n->groups) { for (int32_t g = 0; g < c->num_groups; g++) if (n->groups[g].cap) free(n->groups[g].v); free(n->groups); }
    }
    free(c->nodes); free(c->free_nodes); free(c->dirty);
    for (int32_t s = 0; s < c->num_slots; s++) Py_XDECREF(c->slot_effs[s]);
    free(c->slot_cls); free(c->slot_effs); free(c->cls_effs); free(c->cls_tuple);
    if (c->row) for (int32_t b = 0; b < c->num_blocks; b++) if (c->row[b].keys.cap) free(c->row[b].keys.v);
    free(c->row); free(c->release_seq);
    for (int tier = 0; tier < 2; tier++) {
        free(c->tiers[tier].min_heap.v); free(c->tiers[tier].max_heap.v);
        free(c->tiers[tier].sorted[0]); free(c->tiers[tier].sorted[1]);
    }
    for (int32_t l = 0; l < c->num_levels; l++) free(c->levels[l].heap.v);
    free(c->levels); free(c->is_attn);
    Py_XDECREF(c->node_of); Py_XDECREF(c->slot_of); Py_XDECREF(c->effs_of); Py_XDECREF(c->zero_effs);
    Py_XDECREF(c->reason);
    for (int32_t id = 0; id < c->cap_id_ints; id++) Py_XDECREF(c->id_ints[id]);
    free(c->id_ints);
    for (int i = 0; i < 4; i++) Py_XDECREF(c->reason_ints[i]);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static int Core_traverse(Core *c, visitproc visit, void *arg) {
    Py_VISIT(c->node_of); Py_VISIT(c->slot_of); Py_VISIT(c->effs_of); Py_VISIT(c->reason);
    for (int32_t id = 0; id < c->num_nodes; id++) { Py_VISIT(c->nodes[id].prefix); Py_VISIT(c->nodes[id].parent); }
    return 0;
}

static int Core_clear_refs(Core *c) {
    Py_CLEAR(c->effs_of);        /* the only reference that can close a cycle (a bound method of the owner) */
    return 0;
}

static int Core_init(Core *c, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"group_is_attn", "num_blocks", "num_variants", "effs_of", NULL};
    PyObject *kinds, *effs_of;
    Py_ssize_t num_blocks, num_variants;
    if (c->row) { PyErr_SetString(PyExc_RuntimeError, "BlockCore is initialised once"); return -1; }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OnnO", kwlist, &kinds, &num_blocks, &num_variants, &effs_of)) return -1;
    if (num_variants < 1 || num_variants > 2) { PyErr_SetString(PyExc_ValueError, "num_variants must be 1 or 2"); return -1; }
    if (num_blocks < 0 || num_blocks > (1 << 30)) { PyErr_SetString(PyExc_ValueError, "num_blocks out of range"); return -1; }
    PyObject *seq = PySequence_Fast(kinds, "group_is_attn must be a sequence");
    if (!seq) return -1;
    c->num_groups = (int32_t)PySequence_Fast_GET_SIZE(seq);
    c->is_attn = calloc((size_t)c->num_groups + 1, 1);
    if (!c->is_attn) { Py_DECREF(seq); PyErr_NoMemory(); return -1; }
    for (int32_t g = 0; g < c->num_groups; g++) {
        int t = PyObject_IsTrue(PySequence_Fast_GET_ITEM(seq, g));
        if (t < 0) { Py_DECREF(seq); return -1; }
        c->is_attn[g] = (uint8_t)t;
        if (t) c->num_attn_groups++; else c->num_state_groups++;
    }
    Py_DECREF(seq);
    c->num_blocks = (int32_t)num_blocks;
    c->num_variants = (int32_t)num_variants;
    Py_INCREF(effs_of); c->effs_of = effs_of;
    c->node_of = PyDict_New(); c->slot_of = PyDict_New();
    c->zero_effs = PyTuple_New(num_variants);
    if (!c->node_of || !c->slot_of || !c->zero_effs) return -1;
    for (Py_ssize_t v = 0; v < num_variants; v++) PyTuple_SET_ITEM(c->zero_effs, v, PyFloat_FromDouble(0.0));
    for (int i = 0; i < 4; i++) if (!(c->reason_ints[i] = PyLong_FromLong(i))) return -1;
    /* class 0: no efficiency (a block holding nothing a hit can use) */
    c->cap_cls = 16;
    c->cls_effs = calloc((size_t)c->cap_cls * num_variants, sizeof(double));
    c->cls_tuple = calloc((size_t)c->cap_cls, sizeof(PyObject *));
    if (!c->cls_effs || !c->cls_tuple) { PyErr_NoMemory(); return -1; }
    c->cls_tuple[0] = c->zero_effs;
    c->num_cls = 1;
    size_t n = (size_t)num_blocks + 1;
    c->row = calloc(n, sizeof(Row));
    c->release_seq = calloc(n, sizeof(int64_t));
    c->reason = PyList_New(num_blocks);
    if (!c->row || !c->release_seq) {
        PyErr_NoMemory(); return -1;
    }
    if (!c->reason) return -1;
    for (Py_ssize_t b = 0; b < num_blocks; b++) {
        Py_INCREF(c->reason_ints[DEAD]);
        PyList_SET_ITEM(c->reason, b, c->reason_ints[DEAD]);
        c->row[b].level_of = NONE_ID;
        c->row[b].tier_of = NONE_ID;
    }
    int shift = 0;
    while ((1LL << shift) <= num_blocks) shift++;
    c->shift = shift < 1 ? 1 : shift;
    c->mask = ((uint64_t)1 << c->shift) - 1;
    if (ensure_levels(c, 0) < 0) return -1;
    return 0;
}

static PyMethodDef Core_methods[] = {
    {"cached", (PyCFunction)(void (*)(void))Core_cached, METH_FASTCALL,
     "cached(block_id, prefix, group_id, depth, parent): block_id now answers lookups for prefix in group_id."},
    {"uncached", (PyCFunction)(void (*)(void))Core_uncached, METH_FASTCALL,
     "uncached(block_id, prefix, group_id): block_id no longer answers lookups for prefix."},
    {"released", (PyCFunction)Core_released, METH_O, "released(block_id): a cached block entered the free queue."},
    {"taken", (PyCFunction)Core_taken, METH_O, "taken(block_id): a block left the free queue."},
    {"victim", (PyCFunction)(void (*)(void))Core_victim, METH_FASTCALL,
     "victim(alpha, variant) -> (block_id, reason id) | None: the index's victim; changes nothing."},
    {"evict", (PyCFunction)(void (*)(void))Core_evict, METH_FASTCALL,
     "evict(alpha, variant, count) -> [(block_id, reason id), ...]: up to count victims, one after another, "
     "each taken and its keys dropped before the next is picked."},
    {"clear", (PyCFunction)Core_clear, METH_NOARGS, "Every hash dropped."},
    {"keys_of", (PyCFunction)Core_keys_of, METH_O, "keys_of(block_id) -> ((prefix, group), ...)."},
    {"prefix_info", (PyCFunction)Core_prefix_info, METH_O, "prefix_info(prefix) -> (depth, parent); KeyError."},
    {"rows", (PyCFunction)Core_rows, METH_NOARGS, "(free_seq, release_seq, verdicts) per block."},
    {"snapshot", (PyCFunction)Core_snapshot, METH_NOARGS, "(prefixes, kv_children, block_keys), for checks."},
    {"members", (PyCFunction)Core_members, METH_NOARGS, "The index's members: {block: (set, effs, seq)}."},
    {"check_index", (PyCFunction)Core_check_index, METH_NOARGS, "Recount the index; AssertionError on drift."},
    {NULL, NULL, 0, NULL}
};

static PyGetSetDef Core_getset[] = {
    {"reason", (getter)Core_get_reason, NULL, "The live list of reason ids per block (judgements flushed).", NULL},
    {NULL, NULL, NULL, NULL, NULL}
};

static PySequenceMethods Core_as_sequence = {.sq_length = (lenfunc)Core_len};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "marconi.integrations.vllm._blockcore.BlockCore",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The compiled BlockEvictionState core (see blockcore.PyBlockCore, its specification).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Core_init,
    .tp_dealloc = (destructor)Core_dealloc,
    .tp_traverse = (traverseproc)Core_traverse,
    .tp_clear = (inquiry)Core_clear_refs,
    .tp_methods = Core_methods,
    .tp_getset = Core_getset,
    .tp_as_sequence = &Core_as_sequence,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_blockcore", "The compiled core of BlockEvictionState.", -1, NULL,
};

PyMODINIT_FUNC PyInit__blockcore(void) {
    if (PyType_Ready(&CoreType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&CoreType);
    if (PyModule_AddObject(m, "BlockCore", (PyObject *)&CoreType) < 0) { Py_DECREF(&CoreType); Py_DECREF(m); return NULL; }
    return m;
}
