"""WebShop (Yao et al., 2022): text-mode web shopping; see env.py for what is faithful."""
