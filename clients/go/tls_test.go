package dlock

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeCert writes a certificate (signed by parent, or self-signed) and
// its key as PEM files in dir; returns the paths, the certificate and key.
func writeCert(t *testing.T, dir, name string, tmpl *x509.Certificate, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (string, string, *x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPath, keyPath := filepath.Join(dir, name+".pem"), filepath.Join(dir, name+".key")
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certPath, keyPath, cert, key
}

func TestTLSAndMutualTLSFromTheEnvironment(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	caPath, _, ca, caKey := writeCert(t, dir, "ca", &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}, nil, nil)
	srvCert, srvKey, _, _ := writeCert(t, dir, "server", &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, ca, caKey)
	cliCert, cliKey, _, _ := writeCert(t, dir, "client", &x509.Certificate{
		SerialNumber: big.NewInt(3), Subject: pkix.Name{CommonName: "worker"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, ca, caKey)
	ctx := testCtx(t)

	s := startServer(t, "", "--tls-cert", srvCert, "--tls-key", srvKey)
	t.Setenv("DLOCK_TLS_CA", caPath)
	c := connect(t, s.Addr, nil)
	if _, err := c.Lock(ctx, []string{"k"}, &LockOptions{Try: true}); err != nil {
		t.Fatal(err)
	}
	// Plain TCP to a TLS server fails, saying so
	// (TestAPlainClientAtATLSPortIsToldToGiveTheCA).
	t.Setenv("DLOCK_TLS_CA", "")
	if _, err := Connect(ctx, s.Addr, &Options{ConnectTimeout: 2 * time.Second}); !errors.Is(err, ErrUnavailable) || !errors.Is(err, ErrTLSMismatch) {
		t.Fatalf("plain TCP to a TLS server: %v", err)
	}

	mutual := startServer(t, "", "--tls-cert", srvCert, "--tls-key", srvKey, "--tls-client-ca", caPath)
	t.Setenv("DLOCK_TLS_CA", caPath)
	if _, err := Connect(ctx, mutual.Addr, &Options{ConnectTimeout: 2 * time.Second}); err == nil {
		t.Fatal("a server that requires a client certificate accepted none")
	}
	t.Setenv("DLOCK_TLS_CERT", cliCert)
	t.Setenv("DLOCK_TLS_KEY", cliKey)
	m := connect(t, mutual.Addr, nil)
	if _, err := m.Ping(ctx); err != nil {
		t.Fatal(err)
	}
}

// caCert writes a CA's certificate and key (ca.pem, ca.key) in dir.
func caCert(t *testing.T, dir string) (string, *x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	now := time.Now()
	path, _, ca, key := writeCert(t, dir, "ca", &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}, nil, nil)
	return path, ca, key
}

// serverCert writes a certificate for 127.0.0.1 signed by ca (server.pem,
// server.key) in dir.
func serverCert(t *testing.T, dir string, ca *x509.Certificate, caKey *ecdsa.PrivateKey) (string, string) {
	t.Helper()
	now := time.Now()
	cert, key, _, _ := writeCert(t, dir, "server", &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, ca, caKey)
	return cert, key
}

// closedPort is an address nothing listens on (a port just given up).
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// wantTLSError checks that err is a *TLSError of problem (returned as is,
// not among a ConnectError's attempts: no other node was tried) whose
// message says every part of want.
func wantTLSError(t *testing.T, err error, problem TLSProblem, want ...string) {
	t.Helper()
	t.Logf("%v", err)
	var te *TLSError
	if !errors.As(err, &te) || te.Problem != problem {
		t.Fatalf("want a TLS error (%v), got %T: %v", problem, err, err)
	}
	if _, ok := err.(*TLSError); !ok {
		t.Fatalf("want the TLS error itself, no other node tried, got %T: %v", err, err)
	}
	if !errors.Is(err, ErrTLSMismatch) || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("%v: not ErrTLSMismatch and ErrUnavailable", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("%q does not say %q", err, w)
		}
	}
	if strings.Contains(err.Error(), "is dlock-server running") {
		t.Fatalf("%q guesses the server is not running", err)
	}
}

// A plain client at a TLS port reads the server's TLS alert, not a frame
// of 352 MB, and is told to give the CA; not tried on the other nodes.
func TestAPlainClientAtATLSPortIsToldToGiveTheCA(t *testing.T) {
	dir := t.TempDir()
	_, ca, caKey := caCert(t, dir)
	cert, key := serverCert(t, dir, ca, caKey)
	s := startServer(t, "", "--tls-cert", cert, "--tls-key", key)
	t.Setenv("DLOCK_TLS_CA", "")
	ctx := testCtx(t)
	started := time.Now()
	_, err := Connect(ctx, s.Addr+","+closedPort(t), &Options{ConnectTimeout: 5 * time.Second})
	wantTLSError(t, err, ServerSpeaksTLS, "dlock: the server at "+s.Addr+" speaks TLS: give the CA certificate that signed its certificate with Options.TLS (DLOCK_TLS_CA)")
	if strings.Contains(err.Error(), "352518912") {
		t.Fatalf("%q took the TLS alert for a frame length", err)
	}
	if took := time.Since(started); took > 2*time.Second {
		t.Fatalf("took %v: went round the nodes", took)
	}
}

// A TLS client at a plain port is told that the server does not speak TLS
// and what to change; not tried on the other nodes.
func TestATLSClientAtAPlainPortIsToldTheServerDoesNotSpeakTLS(t *testing.T) {
	dir := t.TempDir()
	caPath, _, _ := caCert(t, dir)
	cfg, err := TLSConfig(caPath, "", "")
	if err != nil {
		t.Fatal(err)
	}
	s := startServer(t, "")
	_, err = Connect(testCtx(t), s.Addr+","+closedPort(t), &Options{TLS: cfg, ConnectTimeout: 5 * time.Second})
	wantTLSError(t, err, ServerSpeaksNoTLS,
		"dlock: the server at "+s.Addr+" does not speak TLS (tls: ",
		"): connect without Options.TLS (DLOCK_TLS_CA), or start dlock-server with --tls-cert and --tls-key")
}

// A server certificate of another CA, or for another address, is refused
// saying what to change (crypto/x509 names only the check that failed).
func TestAServerCertificateOfAnotherCAOrAddressSaysWhatToChange(t *testing.T) {
	dir := t.TempDir()
	_, ca, caKey := caCert(t, dir)
	cert, key := serverCert(t, dir, ca, caKey)
	s := startServer(t, "", "--tls-cert", cert, "--tls-key", key)
	otherPath, _, _ := caCert(t, t.TempDir())
	other, err := TLSConfig(otherPath, "", "")
	if err != nil {
		t.Fatal(err)
	}
	_, err = Connect(testCtx(t), s.Addr, &Options{TLS: other, ConnectTimeout: 5 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "give Options.TLS (DLOCK_TLS_CA) the CA file that signed it") {
		t.Fatalf("another CA: %v", err)
	}
	right, err := TLSConfig(filepath.Join(dir, "ca.pem"), "", "")
	if err != nil {
		t.Fatal(err)
	}
	// The certificate names 127.0.0.1; dialled as localhost.
	_, port, _ := net.SplitHostPort(s.Addr)
	_, err = Connect(testCtx(t), "localhost:"+port, &Options{TLS: right, ConnectTimeout: 5 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "does not name localhost") {
		t.Fatalf("another name: %v", err)
	}
}

// One self-signed CA certificate as both the server's certificate and the
// client's CA: crypto/tls accepts it, rustls (the Rust client, dlock)
// refuses it; so does this client, saying what to do. The certificates
// `dlock-server cert` makes, a CA and a node's signed by it, serve.
func TestACACertificateAsTheServersOwnIsRefused(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	both, bothKey, _, _ := writeCert(t, dir, "both", &x509.Certificate{
		SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}, nil, nil)
	// dlock-server refuses such a certificate at start, so a bare TLS
	// listener presents it.
	odd := tlsListener(t, both, bothKey)
	t.Setenv("DLOCK_TLS_CA", both)
	c, err := Connect(testCtx(t), odd+","+closedPort(t), &Options{ConnectTimeout: 5 * time.Second})
	if err == nil {
		_ = c.Close()
	}
	wantTLSError(t, err, CAUsedAsServerCertificate,
		"dlock: the server at "+odd+" presents a CA certificate as its own (",
		"): make a CA and a server certificate signed by it (dlock-server cert create-ca, then create-node), give the server the node's and the clients the CA's")

	certs := filepath.Join(dir, "certs")
	for _, args := range [][]string{{"create-ca"}, {"create-node", "n1", "--addr", "127.0.0.1"}} {
		cmd := exec.Command(serverBin(t), append(append([]string{"cert"}, args...), "--dir", certs)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("dlock-server cert %v: %v\n%s", args, err, out)
		}
	}
	s := startServer(t, "", "--tls-cert", filepath.Join(certs, "n1.pem"), "--tls-key", filepath.Join(certs, "n1.key"))
	t.Setenv("DLOCK_TLS_CA", filepath.Join(certs, "ca.pem"))
	if _, err := connect(t, s.Addr, nil).Ping(testCtx(t)); err != nil {
		t.Fatal(err)
	}
}

// A TLS listener on loopback that presents certFile and completes
// handshakes, speaking nothing after them: its address.
func tlsListener(t *testing.T, certFile, keyFile string) string {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{pair}})
	if err != nil {
		t.Fatal(err)
	}
	serveEach(t, ln, func(conn net.Conn) {
		_ = conn.(*tls.Conn).Handshake()
		_ = conn.Close()
	})
	return ln.Addr().String()
}

// serveEach hands every connection ln accepts to serve, on a goroutine of
// its own, until the test ends and closes ln.
func serveEach(t *testing.T, ln net.Listener, serve func(net.Conn)) {
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go serve(conn)
		}
	}()
}

// A connection closed unanswered, or refused, is no sign of TLS: no guess
// about TLS in the error.
func TestNoTLSGuessWhereTLSIsNotTheCause(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveEach(t, ln, func(conn net.Conn) { _ = conn.Close() })
	t.Setenv("DLOCK_TLS_CA", "")
	for _, addr := range []string{ln.Addr().String(), closedPort(t)} {
		_, err := Connect(testCtx(t), addr, &Options{ConnectTimeout: 2 * time.Second})
		if err == nil || !errors.Is(err, ErrUnavailable) {
			t.Fatalf("%s: %v", addr, err)
		}
		var te *TLSError
		if errors.As(err, &te) || strings.Contains(err.Error(), "TLS") {
			t.Fatalf("%s: %q blames TLS", addr, err)
		}
	}
}

// The record header rule: an alert or a handshake, versions 3.0 to 3.4.
func TestLooksLikeTLS(t *testing.T) {
	for _, c := range []struct {
		b    []byte
		want bool
	}{
		{[]byte{0x15, 0x03, 0x03, 0x00, 0x02}, true},
		{[]byte{0x16, 0x03, 0x01}, true},
		{[]byte{0x16, 0x03, 0x04}, true},
		{[]byte{0x16, 0x03, 0x05}, false},
		{[]byte{0x17, 0x03, 0x03}, false},
		{[]byte{0x15, 0x02, 0x00}, false},
		{[]byte{0x00, 0x00, 0x00, 0x10}, false},
		{[]byte{0x15, 0x03}, false},
	} {
		if got := looksLikeTLS(c.b); got != c.want {
			t.Errorf("looksLikeTLS(% x) = %v", c.b, got)
		}
	}
}

// A TLS client given a cluster node's TLS peer port (--peer-listen) by
// mistake is told so, in the Rust client's words, and not to give a
// client certificate; not tried on the other nodes. The node's client
// port (--listen), with the same TLS files, takes the client offering
// "dlock". One node: the peer port's TLS answers before any election.
func TestATLSClientAtATLSPeerPortIsToldToGiveAClientPort(t *testing.T) {
	t.Parallel()
	certs := filepath.Join(t.TempDir(), "certs")
	for _, args := range [][]string{{"create-ca"}, {"create-node", "n1", "--addr", "127.0.0.1"}} {
		cmd := exec.Command(serverBin(t), append(append([]string{"cert"}, args...), "--dir", certs)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("dlock-server cert %v: %v\n%s", args, err, out)
		}
	}
	cert, key, ca := filepath.Join(certs, "n1.pem"), filepath.Join(certs, "n1.key"), filepath.Join(certs, "ca.pem")
	c := startCluster(t, 1, "--tls-cert", cert, "--tls-key", key,
		"--peer-tls-cert", cert, "--peer-tls-key", key, "--peer-tls-ca", ca)
	cfg, err := TLSConfig(ca, "", "")
	if err != nil {
		t.Fatal(err)
	}
	_, err = Connect(testCtx(t), c.peers[0]+","+closedPort(t), &Options{TLS: cfg, ConnectTimeout: 5 * time.Second})
	wantTLSError(t, err, NotAClientPort,
		"dlock: the server at "+c.peers[0]+" refuses dlock's TLS protocol name (",
		"): it is no dlock client port, most likely a cluster node's peer port (its --peer-listen): give a client port instead (a node's --listen)")
	if strings.Contains(err.Error(), "certificate") {
		t.Fatalf("%q speaks of certificates", err)
	}

	cl, err := Connect(testCtx(t), c.Addrs[0], &Options{TLS: cfg, ConnectTimeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("TLS at the client port: %v", err)
	}
	defer cl.Close()
	if _, err := cl.Ping(testCtx(t)); err != nil {
		t.Fatal(err)
	}
}
