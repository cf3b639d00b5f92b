//go:build faults

package faults

import (
	"bufio"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/servers"
)

// newerThan62 are the commands (and "COMMAND SUBCOMMAND"s) Redis added
// after 6.2: 7.0, 7.2 and 7.4 (https://redis.io/docs/latest/commands/,
// "Available since").
var newerThan62 = map[string]string{
	"BLMPOP": "7.0", "BZMPOP": "7.0", "LMPOP": "7.0", "ZMPOP": "7.0", "SINTERCARD": "7.0", "ZINTERCARD": "7.0",
	"EVAL_RO": "7.0", "EVALSHA_RO": "7.0", "FCALL": "7.0", "FCALL_RO": "7.0", "FUNCTION": "7.0",
	"EXPIRETIME": "7.0", "PEXPIRETIME": "7.0", "SPUBLISH": "7.0", "SSUBSCRIBE": "7.0", "SUNSUBSCRIBE": "7.0",
	"COMMAND DOCS": "7.0", "COMMAND LIST": "7.0", "COMMAND GETKEYSANDFLAGS": "7.0",
	"CLUSTER SHARDS": "7.0", "CLUSTER LINKS": "7.0", "CLUSTER ADDSLOTSRANGE": "7.0", "CLUSTER DELSLOTSRANGE": "7.0",
	"PUBSUB SHARDCHANNELS": "7.0", "PUBSUB SHARDNUMSUB": "7.0", "ACL DRYRUN": "7.0", "CLIENT NO-EVICT": "7.0",
	"LATENCY HISTOGRAM": "7.0",
	"CLIENT NO-TOUCH":   "7.2", "WAITAOF": "7.2", "CLUSTER MYSHARDID": "7.2",
	"HEXPIRE": "7.4", "HPEXPIRE": "7.4", "HEXPIREAT": "7.4", "HPEXPIREAT": "7.4", "HTTL": "7.4", "HPTTL": "7.4",
	"HEXPIRETIME": "7.4", "HPEXPIRETIME": "7.4", "HPERSIST": "7.4",
}

// goRedisIdentity is the one newer command go-redis sends itself: on
// every new connection, CLIENT SETINFO (7.2) in the HELLO pipeline, whose
// error reply it ignores, so a 6.2 server's "unknown subcommand" is
// harmless. (ClusterOptions/Options.DisableIdentity turns it off.)
const goRedisIdentity = "CLIENT SETINFO"

// expireOptionsSince70 are EXPIRE-family options added in 7.0.
var expireOptionsSince70 = map[string]bool{"NX": true, "XX": true, "GT": true, "LT": true}

var monitorLine = regexp.MustCompile(`^\d+\.\d+ \[\d+ ([^\]]+)\] (.*)$`)

// monitorArgs splits MONITOR's quoted argument list.
func monitorArgs(s string) []string {
	var out []string
	for len(s) > 0 {
		s = strings.TrimLeft(s, " ")
		if s == "" || s[0] != '"' {
			break
		}
		q, err := strconv.QuotedPrefix(s)
		if err != nil {
			break
		}
		v, _ := strconv.Unquote(q)
		out = append(out, v)
		s = s[len(q):]
	}
	return out
}

// Scenario V: the Redis 6.2 claim. A MONITOR watches every command the
// workers send (and, marked "lua", every command their scripts run)
// through a run with expiry notifications, a SIGKILLed worker recovered,
// RecoverNow, Track/Untrack/Release and SIGTERM shutdowns; no command, no
// subcommand and no EXPIRE option newer than 6.2 may appear but go-redis's
// own CLIENT SETINFO, whose error it ignores.
func TestScenarioVCommandsSentExistInRedis62(t *testing.T) {
	e := newEnv(t, "V every command sent exists in Redis 6.2", envConfig{rows: 200})
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Skip("no redis-cli for MONITOR")
	}
	mon := exec.Command(cli, "-h", "127.0.0.1", "-p", strconv.Itoa(e.redisSrv.Port), "monitor")
	mon.SysProcAttr = servers.ChildAttr(nil, true)
	out, err := mon.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, mon.Start())
	var (
		mu   sync.Mutex
		seen = map[string]int{}
		bad  = map[string]string{}
		lua  int
		done = make(chan struct{})
	)
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<24)
		for sc.Scan() {
			m := monitorLine.FindStringSubmatch(sc.Text())
			if m == nil {
				continue
			}
			args := monitorArgs(m[2])
			if len(args) == 0 {
				continue
			}
			name := strings.ToUpper(args[0])
			full := name
			if len(args) > 1 {
				full = name + " " + strings.ToUpper(args[1])
			}
			mu.Lock()
			if m[1] == "lua" {
				lua++
			}
			seen[name]++
			for _, k := range []string{name, full} {
				if v, ok := newerThan62[k]; ok && k != goRedisIdentity {
					bad[k] = v
				}
			}
			switch name {
			case "EXPIRE", "PEXPIRE", "EXPIREAT", "PEXPIREAT":
				if len(args) > 3 && expireOptionsSince70[strings.ToUpper(args[3])] {
					bad[name+" "+strings.ToUpper(args[3])] = "7.0"
				}
			}
			mu.Unlock()
		}
	}()
	t.Cleanup(func() { _ = mon.Process.Kill(); _ = mon.Wait() })
	time.Sleep(200 * time.Millisecond) // MONITOR is on before the first worker connects

	ws := e.start([]string{"v-w1", "v-w2", "v-w3"}, "-expiry-notifications")
	e.waitMidBlock(ws[0])
	killedAt := time.Now()
	ws[0].kill(t)
	stranded := e.inprogOf(ws[0].id)
	require.NotEmpty(t, stranded)
	e.res.Detection = e.waitReset(ws[0].id, stranded, killedAt, detectionBound)
	e.res.Bound = detectionBound
	ws[1].signal(t, syscall.SIGUSR1)
	ws[1].waitLog(t, "recover now", 10*time.Second)
	e.finish(true)
	_ = mon.Process.Kill()
	<-done

	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, seen, "MONITOR saw the workers' commands")
	assert.Positive(t, lua, "MONITOR saw the commands the scripts ran")
	assert.Empty(t, bad, "commands or options newer than Redis 6.2 sent")
	var names []string
	for n, c := range seen {
		names = append(names, n+"="+strconv.Itoa(c))
	}
	e.res.note("%d distinct commands, %d run by scripts: %s", len(seen), lua, strings.Join(slices.Sorted(slices.Values(names)), " "))
}
