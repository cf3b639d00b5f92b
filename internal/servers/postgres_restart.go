package servers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// Halt stops the server the way an operator or a crash of the database
// host would be seen by clients: a fast shutdown (every session is ended,
// new connections are refused) followed by SIGKILL after 10 seconds. The
// data folder is kept, so Resume can start the same cluster again on the
// same port. Halt and Resume are for fault-injection tests; they must not
// be called concurrently with each other or with Stop.
func (p *Postgres) Halt() error {
	if p.cmd == nil || p.cmd.Process == nil {
		return errors.New("postgres was never started")
	}
	if p.cmd.ProcessState != nil {
		return nil // already halted
	}
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
	return nil
}

// Resume starts a halted server again with the same data, port and
// settings, and returns once it accepts connections or ctx ends. Without a
// deadline on ctx, DefaultStartTimeout bounds it.
func (p *Postgres) Resume(ctx context.Context) error {
	if p.cmd == nil {
		return errors.New("postgres was never started")
	}
	if p.cmd.ProcessState == nil {
		return errors.New("postgres is running: Halt it first")
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultStartTimeout)
		defer cancel()
	}
	old := p.cmd
	cmd := exec.Command(old.Path, old.Args[1:]...)
	cmd.SysProcAttr, cmd.Dir = old.SysProcAttr, old.Dir
	cmd.Stdout, cmd.Stderr = p.logf, p.logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("restart postgres: %w", err)
	}
	p.cmd = cmd // Halt and Stop wait for this one now
	if err := p.waitReady(ctx); err != nil {
		log, _ := os.ReadFile(filepath.Join(p.Dir, "postgres.log"))
		return fmt.Errorf("postgres did not accept connections after a restart: %v; log: %s", err, log)
	}
	return nil
}
