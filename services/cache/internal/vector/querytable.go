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
	keys  []uint32
	vals  []float32 // 0 marks an empty cell: zero-weight coordinates add nothing and are left out
	shift uint8
}

// reset fills t with q's coordinates, at most half of the cells used.
func (t *queryTable) reset(q Vector) {
	n := 1 << bits.Len(uint(2*len(q.Indices)))
	if cap(t.keys) < n {
		t.keys, t.vals = make([]uint32, n), make([]float32, n)
	}
	t.keys, t.vals = t.keys[:n], t.vals[:n]
	clear(t.vals)
	t.shift = uint8(32 - bits.TrailingZeros(uint(n)))
	mask := uint32(n - 1)
	for i, k := range q.Indices {
		w := q.Values[i]
		if w == 0 {
			continue
		}
		for h := t.cell(k); ; h = (h + 1) & mask {
			if t.vals[h] == 0 {
				t.keys[h], t.vals[h] = k, w
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
	mask := uint32(len(t.keys) - 1)
	keys, vals := t.keys, t.vals
	var sum float32
	for j, k := range indices {
		for h := t.cell(k) & mask; vals[h] != 0; h = (h + 1) & mask {
			if keys[h] == k {
				sum += vals[h] * values[j]
				break
			}
		}
	}
	return sum
}
