/*
 * tune_file.h - the tuning file: plans weft-tune measured for one
 * communicator shape, read at init so that the first call of a size class
 * runs the measured plan without trials.  Format in docs/design.md
 * ("Tuning file"); the parser, the table it fills and the atomic writer.
 */
#ifndef WEFT_TUNE_FILE_H
#define WEFT_TUNE_FILE_H

#include "select/topo.h"
#include "select/tune.h"

#define WEFT_TUNE_ANY_ESIZE 4 /* a point's esize_idx: every element size ("*") */
/* Distinct points a section can hold: a collective, element size (four
 * and "*") and size class each. */
#define WEFT_TUNE_MAX_POINTS (WEFT_COLL_COUNT * 5 * WEFT_TUNE_CLASSES)
#define WEFT_TUNE_FILE_MAX (4u << 20) /* bytes read at most: a file is a few KiB */

/* One line of a section: coll at class cls in elements of esize_idx
 * (weft_tune_esize_index, or WEFT_TUNE_ANY_ESIZE) runs (algo, variant). */
struct weft_tune_point {
    uint8_t coll, esize_idx, cls, algo, variant;
};

/* The section key of a communicator's shape, as section headers spell it
 * once canonical: "nranks=4 nodes=2 ppn=2 transports=shm,tcp", or with
 * layout=0,1,0,1 (the node of each rank, nodes numbered as they first
 * appear) in place of ppn when the ranks are not in equal blocks per node.
 * Transports: those the table gives some pair of distinct ranks, sorted.
 * malloc'd; NULL when out of memory. */
char *weft_tune_shape_key(const struct weft_link_table *tab) WEFT_HIDDEN;

/* The section of text (a tune file's len bytes; name is what messages call
 * it) whose header is key (compared canonically: any order of fields, of
 * transports, ppn or the layout it stands for): its lines into pts (room
 * for WEFT_TUNE_MAX_POINTS), *n of them; 0 when no section matches.  Every
 * header is checked, and the lines of key's section; other sections'
 * lines are skipped unread.  WEFT_ERR_INVALID_ARG with err holding
 * "name:line: problem" on the first malformed one. */
weft_status_t weft_tune_file_parse(const char *text, size_t len, const char *name, const char *key,
                                   struct weft_tune_point *pts, int *n, char *err, size_t errlen)
    WEFT_HIDDEN;

/* The file that jobs read: WEFT_TUNE_FILE when set (*named true), else
 * $XDG_CACHE_HOME/weft/tune, else $HOME/.cache/weft/tune; false when
 * neither variable is set or the path does not fit len. */
bool weft_tune_file_path(char *buf, size_t len, bool *named) WEFT_HIDDEN;

/* Reads path (at most WEFT_TUNE_FILE_MAX bytes) into *text (malloc'd,
 * NUL-terminated, *len bytes).  WEFT_ERR_UNSUPPORTED when it does not
 * exist; WEFT_ERR_SYSTEM (unreadable, too large, not a file) with err. */
weft_status_t weft_tune_file_read(const char *path, char **text, size_t *len, char *err,
                                  size_t errlen) WEFT_HIDDEN;

/* The plans of a communicator's calls by the points: per (collective,
 * element size), the class measured nearest in size (log scale; ties go
 * to the larger), from half the smallest size measured to under twice the
 * largest; an element size without points of its own takes those of the
 * nearest that has some ("*" points stand for every size, its own win).
 * t->plan entries: algo * WEFT_VAR_COUNT + variant, -1 where none. */
void weft_tune_table_fill(struct weft_tune_table *t, const struct weft_tune_point *pts, int n)
    WEFT_HIDDEN;

/* Writes body (lines, each ending in '\n') as key's section of the tune
 * file at path, under a header "[key]": text before the first section and
 * every other section stay as they are, key's is replaced where it was
 * (else added at the end).  Through a file made in path's folder and
 * renamed over path, so readers see the old file or the new one, never
 * part of either; on failure (folder not writable, disk full, old file
 * unreadable) path is untouched, the temporary removed, and err says why
 * (WEFT_ERR_SYSTEM). */
weft_status_t weft_tune_file_write(const char *path, const char *key, const char *body, char *err,
                                   size_t errlen) WEFT_HIDDEN;

/* A file line's element-type field: a dtype name ("float32"), a size in
 * bytes (1, 2, 4, 8) or "*"; the esize index (WEFT_TUNE_ANY_ESIZE for
 * "*"), -1 when it is none of them. */
int weft_tune_file_esize(const char *s, size_t len) WEFT_HIDDEN;

#endif /* WEFT_TUNE_FILE_H */
