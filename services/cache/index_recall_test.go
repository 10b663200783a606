package cache

import (
	"context"
	"math/rand/v2"
	"testing"
)

// TestIndexRecall measures what the embedded index's approximate search costs against the
// exact search in one partition: the graph walked from the postings' rarest candidates
// (30k entries, past sparseGraph.MinLen) and the postings search within searchLimits (just
// below MinLen, the largest partition it serves). A reworded stored question must still
// find the question it rewords, as the exact search does, and every candidate the
// approximate search returns is one the exact search returns with the same score (it
// loses candidates, it never invents one).
func TestIndexRecall(t *testing.T) {
	if testing.Short() {
		t.Skip("builds 30k-entry partitions")
	}
	t.Parallel()
	for _, tc := range []struct {
		path   string
		n      int
		corpus string
	}{
		{"graph", 30_000, "support"},
		{"graph", 30_000, "numbered"},
		{"bounded", sparseGraph.MinLen - 1, "support"},
		{"bounded", sparseGraph.MinLen - 1, "numbered"},
	} {
		n, corpus := tc.n, tc.corpus
		t.Run(tc.path+"/"+corpus, func(t *testing.T) {
			t.Parallel()
			questions := indexCorpus(corpus, n)
			approx, exact, _ := buildIndexes(t, questions, true)
			r := rand.New(rand.NewPCG(7, 8))
			const queries = 300
			bothFound, exactFound := 0, 0
			for range queries {
				want := r.IntN(n)
				q := lexicalQuery(t, rewordedQuestion(questions[want]))
				got, err := approx.Search(context.Background(), q)
				if err != nil {
					t.Fatalf("Search: %v", err)
				}
				ref, err := exact.Search(context.Background(), q)
				if err != nil {
					t.Fatalf("exact Search: %v", err)
				}
				exactScores := map[string]float32{}
				for _, c := range ref {
					exactScores[c.Entry.ID] = c.Score
				}
				for _, c := range got {
					if s, ok := exactScores[c.Entry.ID]; ok && s != c.Score {
						t.Fatalf("entry %s: score %v, exact %v", c.Entry.ID, c.Score, s)
					}
				}
				wantID := benchEntry(want).ID
				inExact := len(ref) > 0 && ref[0].Entry.ID == wantID
				if inExact {
					exactFound++
					if len(got) > 0 && got[0].Entry.ID == wantID {
						bothFound++
					}
				}
			}
			if exactFound < queries*9/10 {
				t.Fatalf("the exact search found the reworded question %d times of %d: the test does not measure recall", exactFound, queries)
			}
			recall := float64(bothFound) / float64(exactFound)
			t.Logf("%s %s: the index found %d of the %d questions the exact search found first (recall@1 %.3f)", tc.path, corpus, bothFound, exactFound, recall)
			if recall < 0.99 {
				t.Errorf("recall %.3f against the exact search, want at least 0.99", recall)
			}
		})
	}
}
