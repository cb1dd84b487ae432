/*
 * list.h - the algorithm families, one line each: WEFT_ALGO_ENTRY(ENUM,
 * desc) gives enum value WEFT_ALGO_<ENUM> and the descriptor weft_algo_<desc>
 * that the family's own file defines.  The order numbers the plan bits
 * (select/tune.h): append, never reorder.  No include guard: it is read
 * once per expansion (schedule.h, registry.h, registry.c).
 */
WEFT_ALGO_ENTRY(RING, ring)     /* rings and pipelined chains */
WEFT_ALGO_ENTRY(TREE, tree)     /* double binary tree; binomial tree */
WEFT_ALGO_ENTRY(RHD, rhd)       /* recursive halving/doubling, Rabenseifner, scatter+allgather */
WEFT_ALGO_ENTRY(DIRECT, direct) /* every pair at once (small rank counts) */
WEFT_ALGO_ENTRY(HIER, hier)     /* within each node, among nodes, within each node */
