package mesh_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"testing"

	"github.com/mantle-mesh/mantle/pkg/mesh/meshtest"
	"github.com/mantle-mesh/mantle/services/router"
)

// askHTTP sends one question through the HTTP front door at temperature 0, for end user
// user (the OpenAI user field; "" leaves it out), and returns the x-mantle-cache header.
func askHTTP(t *testing.T, m *meshtest.Mesh, question, user string) string {
	t.Helper()
	body := map[string]any{
		"model":       "primary",
		"messages":    []map[string]string{{"role": "user", "content": question}},
		"temperature": 0,
	}
	if user != "" {
		body["user"] = user
	}
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	resp := post(t, m, acmeKey, string(b))
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(resp.Body)
		t.Fatalf("POST %q: status %d: %s", question, resp.StatusCode, msg)
	}
	return resp.Header.Get("x-mantle-cache")
}

// TestCacheGuardThroughTheFrontDoor asks, over HTTP, questions that share almost every
// word with a cached one but differ in a sign, an operator, a currency, an emoji, a
// direction or an opposite word: none may be answered from the cache, while a repeat of
// the cached question is.
func TestCacheGuardThroughTheFrontDoor(t *testing.T) {
	m := meshtest.Start(t, testConfig(), meshtest.All)
	tests := []struct{ name, stored, asked string }{
		{"currency", "Can I withdraw $500 at the airport ATM without a fee?", "Can I withdraw €500 at the airport ATM without a fee?"},
		{"emoji", "The customer replied 👍 to our refund offer, what should the agent do next?", "The customer replied 👎 to our refund offer, what should the agent do next?"},
		{"operator", "What is 200 / 15?", "What is 200 * 15?"},
		{"sign, same exact key", "-5", "5"},
		{"sign", "Is -20 degrees too cold to charge the car outside?", "Is 20 degrees too cold to charge the car outside?"},
		{"opposite in a long sentence", "我在你们店里买的衣服不合身，收到七天以内还能申请退货吗，需要自己付运费吗", "我在你们店里买的衣服不合身，收到七天以内还能申请换货吗，需要自己付运费吗"},
		{"direction", "How long does a transfer from my savings account to my checking account usually take?", "How long does a transfer from my checking account to my savings account usually take?"},
		{"opposite", "What is the maximum daily dose of ibuprofen tablets for an adult with a fever?", "What is the minimum daily dose of ibuprofen tablets for an adult with a fever?"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			askHTTP(t, m, tt.stored, "")
			if got := askHTTP(t, m, tt.stored, ""); got != "hit" {
				t.Fatalf("repeat of %q: x-mantle-cache %q, want hit (the answer was not cached)", tt.stored, got)
			}
			if got := askHTTP(t, m, tt.asked, ""); got == "hit" {
				t.Errorf("%q after %q: x-mantle-cache hit, want the model's own answer", tt.asked, tt.stored)
			}
		})
	}
}

// TestVolatileAndPersonalThroughTheFrontDoor checks over HTTP that volatile questions are
// never served from the cache, that personal ones are served only to the end user who
// asked (the user field), and that general questions that say "my" are shared.
func TestVolatileAndPersonalThroughTheFrontDoor(t *testing.T) {
	m := meshtest.Start(t, testConfig(), meshtest.All)
	for _, q := range []string{"What time is it?", "比特币价格多少", "Is your website down?", "这周末有什么活动"} {
		askHTTP(t, m, q, "alice")
		for _, user := range []string{"alice", "bob"} {
			if got := askHTTP(t, m, q, user); got == "hit" {
				t.Errorf("volatile %q asked again by %s: x-mantle-cache hit, want a fresh answer", q, user)
			}
		}
	}
	for _, q := range []string{"What is my account balance?", "我还有多少积分", "Did my payment go through?"} {
		askHTTP(t, m, q, "alice")
		if got := askHTTP(t, m, q, "alice"); got != "hit" {
			t.Errorf("personal %q asked again by alice: x-mantle-cache %q, want hit (cached for her)", q, got)
		}
		if got := askHTTP(t, m, q, "bob"); got == "hit" {
			t.Errorf("personal %q asked by bob: x-mantle-cache hit, want alice's answer kept from him", q)
		}
		askHTTP(t, m, q+" ", "")
		if got := askHTTP(t, m, q, ""); got == "hit" {
			t.Errorf("personal %q without a user: x-mantle-cache hit, want no caching", q)
		}
	}
	const general = "Can I change my delivery address?"
	askHTTP(t, m, general, "alice")
	if got := askHTTP(t, m, general, "bob"); got != "hit" {
		t.Errorf("general %q asked by bob after alice: x-mantle-cache %q, want hit", general, got)
	}
}

// TestRelatedAnswerRungThroughTheFrontDoor pins a route to the ladder's cache rung and asks,
// over HTTP, questions one opposite word or operator away from cached ones: the near miss
// gets no related answer (the rung's lookup runs the near-miss check too).
func TestRelatedAnswerRungThroughTheFrontDoor(t *testing.T) {
	cfg := testConfig()
	route := router.RouteConfig{Name: "ladder", Scenario: "ladder", Candidates: []string{"primary"}, Ladder: router.LadderConfig{Cache: true}}
	cfg.Router.Routes = append(cfg.Router.Routes, route)
	m := meshtest.Start(t, cfg, meshtest.All)
	ask := func(question string) *http.Response {
		t.Helper()
		b, err := json.Marshal(map[string]any{"model": "ladder", "temperature": 0,
			"messages": []map[string]string{{"role": "user", "content": question}}})
		if err != nil {
			t.Fatal(err)
		}
		return post(t, m, acmeKey, string(b))
	}
	tests := []struct{ stored, asked string }{
		{"What is the maximum daily dose of ibuprofen tablets for an adult with a bad headache and a mild fever?", "What is the minimum daily dose of ibuprofen tablets for an adult with a bad headache and a mild fever?"},
		{"发烧头痛的时候儿童阿司匹林肠溶片每天最多可以吃几片，饭前还是饭后吃比较好", "发烧头痛的时候成人阿司匹林肠溶片每天最多可以吃几片，饭前还是饭后吃比较好"},
		{"公司规定上班路上骑电动车出了交通事故受伤，按照劳动法能不能认定为工伤并报销医疗费用", "公司规定下班路上骑电动车出了交通事故受伤，按照劳动法能不能认定为工伤并报销医疗费用"},
		{"2+3等于几", "2-3等于几"},
		{"门店买的商品支持七天无理由退货吗，退货运费谁出", "网店买的商品支持七天无理由退货吗，退货运费谁出"},
	}
	for _, tt := range tests {
		if resp := ask(tt.stored); resp.StatusCode != http.StatusOK {
			t.Fatalf("POST %q: status %d", tt.stored, resp.StatusCode)
		}
	}
	forced := cfg
	forced.Router.Routes = slices.Clone(cfg.Router.Routes)
	forced.Router.Routes[len(forced.Router.Routes)-1].Ladder.ForceLevel = router.ForceCache
	if err := m.Router.Reload(context.Background(), forced); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	for _, tt := range tests {
		// The cached question itself is still answered from the cache.
		if resp := ask(tt.stored); resp.StatusCode != http.StatusOK || resp.Header.Get("x-mantle-cache") != "hit" {
			t.Fatalf("%q with the route forced to the cache: status %d, x-mantle-cache %q; want its cached answer", tt.stored, resp.StatusCode, resp.Header.Get("x-mantle-cache"))
		}
		if resp := ask(tt.asked); resp.StatusCode == http.StatusOK {
			t.Errorf("%q on the cache rung: status 200 (level %q); want no related answer from %q", tt.asked, resp.Header.Get("x-mantle-fallback-level"), tt.stored)
		}
	}
}
