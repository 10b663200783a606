package vector

import (
	"cmp"
	"errors"
	"slices"

	"github.com/mantle-mesh/mantle/pkg/textsim"
)

// Vector is an embedding with unit length, dense or sparse; exactly one form is set. Because
// both operands of every comparison have unit length, their dot product is their cosine
// similarity, which is the only similarity this package computes.
type Vector struct {
	// Dense holds every coordinate.
	Dense []float32
	// Indices and Values hold the non-zero coordinates of a sparse vector: Indices strictly
	// increasing, Values of the same length.
	Indices []uint32
	Values  []float32
}

// ErrZero is returned for a vector without any weight: it has no direction, so it is
// similar to nothing (an empty prompt, or one made only of punctuation).
var ErrZero = errors.New("vector: zero vector")

// Sparse reports whether v is in sparse form.
func (v Vector) Sparse() bool { return v.Dense == nil }

// Len is the number of stored coordinates (non-zero ones for a sparse vector).
func (v Vector) Len() int {
	if v.Sparse() {
		return len(v.Indices)
	}
	return len(v.Dense)
}

// NewDense returns x scaled to unit length. It copies x.
func NewDense(x []float32) (Vector, error) {
	out := slices.Clone(x)
	if !textsim.Normalize(out) {
		return Vector{}, ErrZero
	}
	return Vector{Dense: out}, nil
}

// Feature is one coordinate of a sparse vector under construction.
type Feature struct {
	Index  uint32
	Weight float32
}

// NewSparse returns the unit-length sparse vector whose coordinates are the sums of the
// weights of features with the same index. It reorders features.
func NewSparse(features []Feature) (Vector, error) {
	slices.SortFunc(features, func(a, b Feature) int { return cmp.Compare(a.Index, b.Index) })
	indices := make([]uint32, 0, len(features))
	values := make([]float32, 0, len(features))
	for _, f := range features {
		if n := len(indices); n > 0 && indices[n-1] == f.Index {
			values[n-1] += f.Weight
			continue
		}
		indices = append(indices, f.Index)
		values = append(values, f.Weight)
	}
	return NewSortedSparse(indices, values)
}

// NewSortedSparse returns the sparse vector of indices (sorted and distinct, which the
// caller ensures) and values, scaled in place to unit length. It keeps both slices.
func NewSortedSparse(indices []uint32, values []float32) (Vector, error) {
	if !textsim.Normalize(values) {
		return Vector{}, ErrZero
	}
	return Vector{Indices: indices, Values: values}, nil
}

// Dot returns the dot product of a and b: their cosine similarity, as both have unit length.
// Vectors of different forms or dimensions have no similarity and return 0.
func Dot(a, b Vector) float32 {
	switch {
	case a.Sparse() && b.Sparse():
		return sparseDot(a.Indices, a.Values, b.Indices, b.Values)
	case !a.Sparse() && !b.Sparse() && len(a.Dense) == len(b.Dense):
		return denseDot(a.Dense, b.Dense)
	default:
		return 0
	}
}

// sparseDot merges two sorted index lists. The indices advance by the comparisons' values
// rather than in branches: which list moves next is a coin toss the CPU cannot predict,
// and the branchless form is about 1.6 times faster on the lexical embedder's vectors.
func sparseDot(ai []uint32, av []float32, bi []uint32, bv []float32) float32 {
	var sum float32
	i, j := 0, 0
	for i < len(ai) && j < len(bi) {
		x, y := ai[i], bi[j]
		if x == y {
			sum += av[i] * bv[j]
		}
		i += oneIf(x <= y)
		j += oneIf(y <= x)
	}
	return sum
}

// oneIf compiles to a flag-setting instruction, not a branch.
func oneIf(b bool) int {
	if b {
		return 1
	}
	return 0
}

// denseDot is unrolled by four: four independent sums let the CPU overlap the
// multiplications instead of waiting on one accumulator.
func denseDot(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return s0 + s1 + s2 + s3
}
