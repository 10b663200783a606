package vector

import "math/bits"

// queryTable holds a sparse query's coordinates in an open-addressing hash table, so that
// scoring a stored vector costs one probe per stored coordinate instead of a merge of both
// index lists. A search that scores many candidates (a partition of prompts from one
// template scores hundreds) builds it once and reuses it for each of them.
//
// Its dot products equal sparseDot's bit for bit: the products are the same and are added
// in the stored vector's index order, which is the merge's order.
type queryTable struct {
	// cells holds each key beside its weight, so that a probe reads one cache line; a
	// weight of 0 marks an empty cell (zero-weight coordinates add nothing and are left out).
	cells []tableCell
	shift uint8
}

type tableCell struct {
	key uint32
	val float32
}

// tableLoad is the inverse of the table's largest load: at most a quarter of the cells
// are used. Most of a stored vector's coordinates are not in the query (a probe that ends
// at an empty cell), and such a probe reads fewer cells in a sparser table; the table stays
// a few kilobytes, in the first-level cache.
const tableLoad = 4

// reset fills t with q's coordinates.
func (t *queryTable) reset(q Vector) {
	n := 1 << bits.Len(uint(tableLoad*len(q.Indices)))
	if cap(t.cells) < n {
		t.cells = make([]tableCell, n)
	}
	t.cells = t.cells[:n]
	clear(t.cells)
	t.shift = uint8(32 - bits.TrailingZeros(uint(n)))
	mask := uint32(n - 1)
	for i, k := range q.Indices {
		w := q.Values[i]
		if w == 0 {
			continue
		}
		for h := t.cell(k); ; h = (h + 1) & mask {
			if t.cells[h].val == 0 {
				t.cells[h] = tableCell{k, w}
				break
			}
		}
	}
}

// cell is k's first cell (Fibonacci hashing: the high bits of a multiplication).
func (t *queryTable) cell(k uint32) uint32 {
	return (k * 0x9e3779b1) >> t.shift
}

// dot returns the dot product of the query with the vector of indices and values.
func (t *queryTable) dot(indices []uint32, values []float32) float32 {
	cells := t.cells
	mask := uint32(len(cells) - 1)
	values = values[:len(indices)]
	var sum float32
	for j, k := range indices {
		for h := t.cell(k) & mask; ; h = (h + 1) & mask {
			c := cells[h]
			if c.val == 0 {
				break
			}
			if c.key == k {
				sum += c.val * values[j]
				break
			}
		}
	}
	return sum
}
