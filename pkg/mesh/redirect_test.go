package mesh_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/mesh/meshtest"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/router"
)

// TestProviderRedirectIsNotFollowed: a provider that answers with a redirect gets no request
// sent on to the redirect's target, neither as the GET Go's client makes of a redirected
// POST (301, 302, 303) nor as a replay of the body and key (307, 308). The caller learns the
// target from the error when no other candidate answers, and gets an answer from the next
// candidate when one does.
func TestProviderRedirectIsNotFollowed(t *testing.T) {
	var followed atomic.Int64 // requests of any method the redirect's target received
	targetSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		followed.Add(1)
		http.Error(w, "not here", http.StatusNotFound)
	}))
	t.Cleanup(targetSrv.Close)
	// Each provider redirects with the status its path names, so that one's open breaker
	// does not hide another's answer; each model is asked by its name.
	mover := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		code, _ := strconv.Atoi(strings.Split(r.URL.Path, "/")[1])
		http.Redirect(w, r, targetSrv.URL+r.URL.Path+"?sig=secret", code)
	}))
	t.Cleanup(mover.Close)
	good := &meshtest.RecordingUpstream{}
	goodSrv := httptest.NewServer(good)
	t.Cleanup(goodSrv.Close)

	t.Setenv("MANTLE_REDIRECT_UPSTREAM_KEY", "sk-upstream")
	keys := []router.KeyConfig{{ID: "k1", Env: "MANTLE_REDIRECT_UPSTREAM_KEY"}}
	cfg := mesh.Default()
	cfg.Auth.Tenants = []rpc.TenantKey{{ID: "compat", KeySHA256: rpc.HashKey(compatKey)}}
	// Every request here fails; the retry budgets must still allow the failover.
	cfg.Router.RetryBudget = router.BudgetConfig{Ratio: 1, Floor: 1000, Window: time.Minute, FormatOnlyAbove: 1}
	cfg.Quota.RetryBudget.Ratio, cfg.Quota.RetryBudget.Floor, cfg.Quota.RetryBudget.FormatOnlyAbove = 1, 1000, 1
	codes := []int{http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther, http.StatusTemporaryRedirect, http.StatusPermanentRedirect}
	for _, code := range codes {
		name := "moved-" + strconv.Itoa(code)
		cfg.Router.Providers = append(cfg.Router.Providers, router.ProviderConfig{Name: name, Type: router.ProviderOpenAI,
			BaseURL: mover.URL + "/" + strconv.Itoa(code) + "/v1", Timeout: 5 * time.Second, Keys: keys})
		cfg.Router.Models = append(cfg.Router.Models, router.ModelConfig{Name: name, Provider: name})
	}
	cfg.Router.Providers = append(cfg.Router.Providers, router.ProviderConfig{Name: "good", Type: router.ProviderOpenAI,
		BaseURL: goodSrv.URL + "/v1", Timeout: 5 * time.Second, Keys: keys})
	cfg.Router.Models = append(cfg.Router.Models, router.ModelConfig{Name: "gpt", Provider: "good"})
	cfg.Router.Routes = append(cfg.Router.Routes, router.RouteConfig{Name: "moved-first", Candidates: []string{"moved-302", "gpt"}})
	base := "http://" + meshtest.Start(t, cfg, meshtest.All).HTTPAddr

	for _, code := range codes {
		res := postChat(t, base, `{"model":"moved-`+strconv.Itoa(code)+`","messages":[`+userMsg+`]}`, nil)
		want := "redirected (HTTP " + strconv.Itoa(code) + ") to " + targetSrv.URL + "/" + strconv.Itoa(code) + "/v1/chat/completions;"
		if res.status == http.StatusOK || !strings.Contains(string(res.body), want) || strings.Contains(string(res.body), "secret") {
			t.Errorf("HTTP %d from the provider: caller got %d %s; want an error naming %q and not the query", code, res.status, res.body, want)
		}
	}
	if res := postChat(t, base, `{"model":"moved-first","messages":[`+userMsg+`]}`, nil); res.status != http.StatusOK || good.Count() != 1 {
		t.Errorf("a redirecting first candidate: caller got %d %s, the next candidate was sent %d requests; want 200 from it", res.status, res.body, good.Count())
	}
	if n := followed.Load(); n != 0 {
		t.Errorf("the redirect target was sent %d requests; want none", n)
	}
}
