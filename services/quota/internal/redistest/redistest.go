// Package redistest finds the Redis the quota packages' tests run against, and gives
// each test a key prefix of its own. It is used only by tests.
package redistest

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The Redis tests use a real server:
//
//  1. MANTLE_TEST_REDIS_ADDR, when set (it must answer);
//  2. else 127.0.0.1:6379, when a Redis answers there (CI machines have one);
//  3. else a redis-server this test binary starts on a free port, without persistence,
//     and stops at the end, when the binary is installed.
//
// With none of these the Redis tests fail under CI=true and are skipped otherwise. Every
// test uses a key prefix of its own and deletes its keys afterwards; nothing is flushed.
var testRedis struct {
	getenv func(string) string
	once   sync.Once
	addr   string
	reason string // why there is no Redis
	fatal  bool   // MANTLE_TEST_REDIS_ADDR was set but does not answer
	server *exec.Cmd
}

// Addr returns the test Redis's address, or skips (fails under CI) the test. getenv
// reads MANTLE_TEST_REDIS_ADDR and CI (the test passes os.Getenv).
func Addr(t testing.TB, getenv func(string) string) string {
	t.Helper()
	testRedis.once.Do(func() { testRedis.getenv = getenv; findTestRedis() })
	if testRedis.addr == "" {
		if testRedis.fatal || testRedis.getenv("CI") == "true" {
			t.Fatalf("Redis tests need a Redis: %s", testRedis.reason)
		}
		t.Skipf("no Redis: %s (set MANTLE_TEST_REDIS_ADDR or install redis-server)", testRedis.reason)
	}
	return testRedis.addr
}

func findTestRedis() {
	if addr := testRedis.getenv("MANTLE_TEST_REDIS_ADDR"); addr != "" {
		if err := pingRedis(addr); err != nil {
			testRedis.reason, testRedis.fatal = fmt.Sprintf("MANTLE_TEST_REDIS_ADDR=%s: %v", addr, err), true
			return
		}
		testRedis.addr = addr
		return
	}
	if pingRedis("127.0.0.1:6379") == nil {
		testRedis.addr = "127.0.0.1:6379"
		return
	}
	path, err := exec.LookPath("redis-server")
	if err != nil {
		testRedis.reason = "nothing answers on 127.0.0.1:6379 and redis-server is not installed"
		return
	}
	addr, cmd, err := StartServer(path)
	if err != nil {
		testRedis.reason = "starting redis-server: " + err.Error()
		return
	}
	testRedis.addr, testRedis.server = addr, cmd
}

func pingRedis(addr string) error {
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 500 * time.Millisecond, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return c.Ping(ctx).Err()
}

// StartServer starts redis-server on a free port and waits for it to say it is
// ready.
func StartServer(path string) (string, *exec.Cmd, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := lis.Addr().(*net.TCPAddr).Port
	_ = lis.Close() // redis-server binds it next; a race with another process is unlikely
	cmd := exec.Command(path, "--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		signalled := false
		for sc.Scan() {
			if !signalled && strings.Contains(sc.Text(), "Ready to accept connections") {
				ready <- true
				signalled = true
			}
		}
		if !signalled {
			ready <- false
		}
	}()
	select {
	case ok := <-ready:
		if ok {
			return fmt.Sprintf("127.0.0.1:%d", port), cmd, nil
		}
		err = fmt.Errorf("redis-server exited before it was ready")
	case <-time.After(10 * time.Second): // a failure timeout, not a wait
		err = fmt.Errorf("redis-server was not ready after 10s")
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	return "", nil, err
}

// Client returns a client of the test Redis, closed when the test ends.
func Client(t testing.TB, getenv func(string) string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: Addr(t, getenv), PoolSize: 256})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

var unsafeKeyChars = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

// Prefix returns a key prefix no other test (or run) uses, and deletes every key
// under it when the test ends.
func Prefix(t testing.TB, c *redis.Client) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := unsafeKeyChars.ReplaceAllString(t.Name(), "_")
	if len(name) > 80 {
		name = name[len(name)-80:]
	}
	prefix := "mantle-test:" + name + ":" + hex.EncodeToString(b[:]) + ":"
	t.Cleanup(func() {
		ctx := context.Background()
		var keys []string
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if err := iter.Err(); err != nil {
			t.Errorf("scanning test keys: %v", err)
			return
		}
		for _, k := range keys {
			if err := c.Del(ctx, k).Err(); err != nil {
				t.Errorf("deleting test key %s: %v", k, err)
			}
		}
	})
	return prefix
}

// Stop stops the redis-server Addr may have started; TestMain calls it after the tests.
func Stop() {
	if cmd := testRedis.server; cmd != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
}
