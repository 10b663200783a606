package vector

import (
	"math"
	"math/rand/v2"
	"testing"
)

// randomSparse draws a sparse vector of n coordinates below limit (NewSparse merges
// repeats and normalises).
func randomSparse(t testing.TB, r *rand.Rand, n int, limit uint32) Vector {
	t.Helper()
	fs := make([]Feature, 0, n)
	for range n {
		fs = append(fs, Feature{Index: r.Uint32N(limit), Weight: r.Float32() + 0.01})
	}
	v, err := NewSparse(fs)
	if err != nil {
		t.Fatalf("NewSparse: %v", err)
	}
	return v
}

// The table's dot product must be sparseDot's bit for bit: searches report it as the exact
// similarity, and the index's tests compare it with Dot.
func TestQueryTableMatchesSparseDot(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(7, 8))
	tests := []struct {
		name         string
		qLen, vLen   int
		limit        uint32
		zeroInQuery  bool
		sharedPrefix int
	}{
		{"one coordinate each", 1, 1, 4, false, 0},
		{"dense overlap in a small space", 40, 40, 64, false, 0},
		{"lexical sizes in the hashed space", 40, 45, 1 << 24, false, 20},
		{"indices that collide in the table", 30, 30, 1 << 31, false, 10},
		{"a zero weight in the query", 10, 10, 16, true, 5},
		{"long stored vector", 5, 500, 1024, false, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var qt queryTable
			for range 200 {
				q := randomSparse(t, r, tt.qLen, tt.limit)
				v := randomSparse(t, r, tt.vLen, tt.limit)
				if tt.sharedPrefix > 0 {
					// Share some of q's coordinates, so that matches are not left to chance.
					fs := make([]Feature, 0, len(v.Indices)+tt.sharedPrefix)
					for i, k := range v.Indices {
						fs = append(fs, Feature{Index: k, Weight: v.Values[i]})
					}
					for i := 0; i < tt.sharedPrefix && i < len(q.Indices); i++ {
						fs = append(fs, Feature{Index: q.Indices[i], Weight: r.Float32() + 0.01})
					}
					var err error
					if v, err = NewSparse(fs); err != nil {
						t.Fatalf("NewSparse: %v", err)
					}
				}
				if tt.zeroInQuery {
					q.Values[0] = 0
				}
				qt.reset(q)
				got := qt.dot(v.Indices, v.Values)
				want := sparseDot(q.Indices, q.Values, v.Indices, v.Values)
				if math.Float32bits(got) != math.Float32bits(want) {
					t.Fatalf("dot = %v, sparseDot = %v (q %v, v %v)", got, want, q, v)
				}
			}
		})
	}
}

// A table reused for a shorter query must not keep the longer one's coordinates.
func TestQueryTableReset(t *testing.T) {
	t.Parallel()
	var qt queryTable
	long := mustSparse(t, 1, 1, 2, 1, 3, 1, 4, 1, 5, 1, 6, 1, 7, 1, 8, 1, 9, 1)
	short := mustSparse(t, 1, 1)
	qt.reset(long)
	qt.reset(short)
	if got := qt.dot([]uint32{5}, []float32{1}); got != 0 {
		t.Errorf("dot with a coordinate of the previous query = %v, want 0", got)
	}
	if got, want := qt.dot([]uint32{1}, []float32{1}), short.Values[0]; got != want {
		t.Errorf("dot with the query's coordinate = %v, want %v", got, want)
	}
}

func BenchmarkSparseScore(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	q := randomSparse(b, r, 40, 1<<24)
	vs := make([]Vector, 256)
	for i := range vs {
		fs := make([]Feature, 0, 45)
		for j, k := range q.Indices {
			if j%6 != 0 { // most coordinates shared, as prompts of one template do
				fs = append(fs, Feature{Index: k, Weight: q.Values[j]})
			}
		}
		for range 8 {
			fs = append(fs, Feature{Index: r.Uint32N(1 << 24), Weight: 0.3})
		}
		vs[i], _ = NewSparse(fs)
	}
	b.Run("merge", func(b *testing.B) {
		var sum float32
		for b.Loop() {
			for _, v := range vs {
				sum += sparseDot(q.Indices, q.Values, v.Indices, v.Values)
			}
		}
		_ = sum
	})
	b.Run("table", func(b *testing.B) {
		var sum float32
		var qt queryTable
		for b.Loop() {
			qt.reset(q)
			for _, v := range vs {
				sum += qt.dot(v.Indices, v.Values)
			}
		}
		_ = sum
	})
}
